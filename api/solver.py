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
from typing import Any

from anyio import to_thread

from api import logs, solve_worker
from api.metrics import Metrics
from api.settings import Settings
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

    def start(self) -> None:
        self._pool = ProcessPoolExecutor(
            max_workers=self.settings.solver_processes, mp_context=multiprocessing.get_context("spawn"),
            initializer=solve_worker.init_worker, initargs=(os.getpid(),))
        # Start and warm the workers now, so the first failure does not pay for process start-up.
        for _ in range(self.settings.solver_processes):
            self._pool.submit(solve_worker.warm_up)

    def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        pool, self._pool = self._pool, None
        if pool is None:
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:  # a CP-SAT solve may run for minutes: do not wait for it
            process.terminate()
        for process in processes:
            process.join(timeout=5)

    def forget_job(self, job_id: str) -> None:
        """The job was deleted: drop its queued solves (a running one ends with its time limit)."""
        for task in list(self._tasks):
            if getattr(task, "solve_key", (None,))[0] == job_id:
                task.cancel()

    def in_flight(self, job_id: str, class_key: str) -> bool:
        return (job_id, class_key) in self._inflight

    def ensure(self, job_id: str, job: JobSpec, class_key: str, canonical_failed: tuple) -> asyncio.Future:
        """The (shared) future of this class's solve; resolves to the final status: done | failed."""
        key = (job_id, class_key)
        future = self._inflight.get(key)
        if future is not None:
            return future
        future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        self.metrics.solves_in_flight.inc()
        task = asyncio.create_task(self._run(key, job, canonical_failed, future))
        task.solve_key = key  # type: ignore[attr-defined]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return future

    async def _run(self, key: tuple[str, str], job: JobSpec, failed: tuple, future: asyncio.Future) -> None:
        job_id, class_key = key
        started = time.perf_counter()
        status = "failed"
        try:
            assert self._pool is not None, "solver not started"
            try:
                summary, timeline = await asyncio.get_running_loop().run_in_executor(
                    self._pool, solve_worker.solve_class, job.model_dump_json(), [list(w) for w in failed],
                    self.settings.solve_time_limit_s, self.settings.use_cp, 0)
                await in_thread(self.store.finish_solve, job_id, class_key, summary, timeline, None)
                status = "done"
            except (SpecError, ValueError, ArithmeticError, KeyError, IndexError) as exc:
                # The planner refused or broke on this class: record why, never retry in a loop.
                log.error("solve failed", extra={"job_id": job_id, "class": class_key, "error": str(exc)})
                await in_thread(self.store.finish_solve, job_id, class_key, None, None,
                                f"{type(exc).__name__}: {exc}")
            elapsed = time.perf_counter() - started
            self.metrics.solve_seconds.observe(elapsed)
            self.metrics.solves.labels(status).inc()
            log.info("solve finished", extra={"job_id": job_id, "class": class_key, "status": status,
                                              "seconds": round(elapsed, 3)})
        except asyncio.CancelledError:
            status = "cancelled"
            raise
        except Exception as exc:  # a broken pool or a deleted job: the solve stays pending, retried later
            log.error("solve aborted", exc_info=exc, extra={"job_id": job_id, "class": class_key})
            status = "pending"
        finally:
            self._inflight.pop(key, None)
            self.metrics.solves_in_flight.dec()
            if not future.done():
                future.set_result(status)
