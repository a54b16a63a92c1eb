"""Solves outside the event loop: a spawn-context process pool, one shared solve per failure class.

`ensure` returns the future of the class's solve, starting it only when none is running: every
request, precompute step and coordinator transition for one (job, class) awaits the same future.
The result is written to the store before the future resolves, so whoever wakes up can read it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from anyio import to_thread
from sqlalchemy.exc import SQLAlchemyError

from api import logs, solve_worker
from api.metrics import Metrics
from api.settings import Settings
from api.solve_queue import CLIENT, SolveQueue
from api.store import Store
from planner.spec import JobSpec, SpecError

log = logs.get("solver")


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run blocking work (database, JSON of big plans) off the event loop."""
    return await to_thread.run_sync(fn, *args)


class Solver:
    def __init__(self, settings: Settings, store: Store, metrics: Metrics):
        self.settings, self.store, self.metrics = settings, store, metrics
        self._pool: ProcessPoolExecutor | None = None
        self._inflight: dict[tuple[str, str], asyncio.Future] = {}
        self._tasks: set[asyncio.Task] = set()
        self.queue = SolveQueue(settings.solver_processes, settings.max_queued_solves)

    def start(self) -> None:
        self._pool = self._new_pool()

    def _new_pool(self) -> ProcessPoolExecutor:
        pool = ProcessPoolExecutor(
            max_workers=self.settings.solver_processes, mp_context=multiprocessing.get_context("spawn"),
            initializer=solve_worker.init_worker, initargs=(os.getpid(),))
        # Start and warm the workers now, so the first failure does not pay for process start-up.
        for _ in range(self.settings.solver_processes):
            pool.submit(solve_worker.warm_up)
        return pool

    def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        pool, self._pool = self._pool, None
        if pool is not None:
            _stop_pool(pool)

    def _replace_pool(self, broken: ProcessPoolExecutor, why: str) -> None:
        """A pool whose process died (kill, out of memory) or overran is useless: start a fresh one.
        Only the first caller replaces it; the others see `self._pool` already changed."""
        if self._pool is broken:
            log.error("solve pool replaced", extra={"reason": why})
            self.metrics.pool_restarts.inc()
            self._pool = self._new_pool()
            # Off the event loop: joining the stopped processes may take a moment.
            asyncio.get_running_loop().run_in_executor(None, _stop_pool, broken)

    def forget_job(self, job_id: str) -> None:
        """The job was deleted: drop its queued solves (a running one ends with its time limit)."""
        for task in list(self._tasks):
            if getattr(task, "solve_key", (None,))[0] == job_id:
                task.cancel()

    def in_flight(self, job_id: str, class_key: str) -> bool:
        return (job_id, class_key) in self._inflight

    def ensure(self, job_id: str, job: JobSpec, class_key: str, canonical_failed: tuple,
               priority: int = CLIENT, refuse: bool = True) -> asyncio.Future:
        """The (shared) future of this class's solve; resolves to the final status: done | failed.

        `priority`: COORDINATOR (workers wait on it) before CLIENT before PRECOMPUTE. A new CLIENT
        solve is refused with `QueueFull` when the queue is full, unless `refuse` is False."""
        key = (job_id, class_key)
        future = self._inflight.get(key)
        if future is not None:
            self.queue.promote(future, priority)
            return future
        if refuse:
            self.queue.check(priority)
        future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        self.metrics.solves_in_flight.inc()
        task = asyncio.create_task(self._run(key, job, canonical_failed, future, priority))
        task.solve_key = key  # type: ignore[attr-defined]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return future

    async def _solve(self, job: JobSpec, failed: tuple, priority: int, token: asyncio.Future
                     ) -> tuple[dict, str]:
        """Wait for a slot, then solve in the pool."""
        await self.queue.acquire(priority, token)
        try:
            return await self._solve_now(job, failed)
        finally:
            self.queue.release()

    async def _solve_now(self, job: JobSpec, failed: tuple) -> tuple[dict, str]:
        """The solve in the pool (a slot is ours, so it starts at once), bounded by
        RECYCLE_SOLVE_DEADLINE_S; a pool that breaks under it is replaced and the solve tried once
        more (a second death is the solve's own doing)."""
        deadline = self.settings.deadline_s
        for attempt in (1, 2):
            pool = self._pool
            if pool is None:
                raise RuntimeError("solver not started")
            try:
                future = asyncio.get_running_loop().run_in_executor(
                    pool, solve_worker.solve_class, job.model_dump_json(), [list(w) for w in failed],
                    self.settings.solve_time_limit_s, self.settings.use_cp, 0)
                return await asyncio.wait_for(future, deadline)
            except TimeoutError:
                self._replace_pool(pool, f"a solve overran its deadline of {deadline:g} s")
                raise solve_worker.SolveFailed(
                    f"the solve overran its deadline of {deadline:g} s (RECYCLE_SOLVE_DEADLINE_S) and was "
                    "stopped") from None
            except BrokenProcessPool:
                self._replace_pool(pool, "a solve process died")
                if attempt == 2:
                    raise solve_worker.SolveFailed(
                        "the solve process died twice while planning this class (killed, or out of "
                        "memory)") from None
        raise AssertionError("unreachable")

    async def _run(self, key: tuple[str, str], job: JobSpec, failed: tuple, future: asyncio.Future,
                   priority: int) -> None:
        job_id, class_key = key
        started = time.perf_counter()
        status = "failed"
        try:
            try:
                summary, timeline = await self._solve(job, failed, priority, future)
                await in_thread(self.store.finish_solve, job_id, class_key, summary, timeline, None)
                status = "done"
            except (solve_worker.SolveFailed, SpecError) as exc:
                # The planner refused or broke on this class: record why, never retry in a loop.
                log.error("solve failed", extra={"job_id": job_id, "class": class_key, "error": str(exc)})
                await in_thread(self.store.finish_solve, job_id, class_key, None, None, str(exc))
            except (asyncio.CancelledError, SQLAlchemyError):
                raise
            except Exception as exc:  # a bug on this side: failed, not pending (no resubmit loop)
                log.error("solve failed unexpectedly", exc_info=exc,
                          extra={"job_id": job_id, "class": class_key})
                await in_thread(self.store.finish_solve, job_id, class_key, None, None,
                                f"{type(exc).__name__}: {' '.join(str(exc).split())[:2000]}")
            elapsed = time.perf_counter() - started
            self.metrics.solve_seconds.observe(elapsed)
            self.metrics.solves.labels(status).inc()
            log.info("solve finished", extra={"job_id": job_id, "class": class_key, "status": status,
                                              "seconds": round(elapsed, 3)})
        except asyncio.CancelledError:
            status = "cancelled"
            raise
        except Exception as exc:  # the store is unreachable: the row stays pending, retried later
            log.error("solve aborted", exc_info=exc, extra={"job_id": job_id, "class": class_key})
            status = "pending"
        finally:
            self._inflight.pop(key, None)
            self.metrics.solves_in_flight.dec()
            if not future.done():
                future.set_result(status)


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:  # a CP-SAT solve may run for minutes: do not wait for it
        process.kill()
    for process in processes:
        process.join(timeout=5)
