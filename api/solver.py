"""Solves outside the event loop: a spawn-context process pool, one shared solve per failure class.

`ensure` returns the future of the class's solve, starting it only when none is running: every
request, precompute step and coordinator transition for one (job, class) awaits the same future.
The result is written to the store before the future resolves, so whoever wakes up can read it.

A second pool of one process solves only quick plans (`api.quick_plan`, a class key starting with
`materials.QUICK_PREFIX`): a coordinator's first plan for a failure set nobody precomputed. The main
pool may be busy for a full solve's time limit (10 s) with another job's or a client's CP-SAT solve;
the quick process never is (each of its solves is a few candidates, under 1 s at 8 x 64), so workers
get an assignment without waiting for it. The failure-free class (a job's generation 1) is solved
there too: its full solve is the fault-free plan, no search, and a new job's workers should not wait
behind CP-SAT either. The quick process also computes each coordinated job's fault-free plan ahead
(`warm_job`), so that job's first quick plan does not pay for it.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any

from anyio import to_thread
from sqlalchemy.exc import SQLAlchemyError

from api import logs, solve_worker
from api.lru import LRU
from api.materials import is_quick
from api.metrics import Metrics
from api.settings import Settings
from api.solve_queue import CLIENT, PRECOMPUTE, SolveQueue
from api.store import Store
from planner.spec import JobSpec, SpecError

log = logs.get("solver")

FULL_SOLVE_NICENESS = 10
"""The main pool's processes run at this `nice`: a full solve is background CPU work, and since the
quick plan, workers no longer wait for it, while serving a generation's answers to every worker
(streams built, written to hundreds of connections) is what they do wait for. Measured at 512
daemons on the server's one pinned core: with the full solve at the server's priority the survivors
held their quick plan only 7.8 s after the report, beats went unread and live workers were declared
failed. At nice 10 the scheduler gives the server ~90% of a shared core when both want it."""


QUICK_SOLVE_NICENESS = 4
"""The quick plan's process runs a little below the server: it shares the server's cores, and a
heartbeat read late is a worker declared failed. At 4,096 daemons on one pinned core, beats begun
in the quick plan's first second after a failure waited up to ~190 ms at the same priority (whole-run
p99 169 / 184 ms in two runs); at nice 4, 69.9 / 68.0 ms, the quick plan as fast (4.9 s there)."""


async def in_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """Run blocking work (database, JSON of big plans) off the event loop."""
    return await to_thread.run_sync(fn, *args)


CACHE_PREFIX = "recycle-fault-free-"


def remove_orphaned_caches(temp_dir: str | None = None) -> list[str]:
    """Remove the temporary fault-free caches of services that are gone. A service killed outright
    (SIGKILL, out of memory) never runs its shutdown, so its directory would stay in /tmp for good;
    each is named after its service's pid, and one whose pid no longer runs is an orphan. Returns the
    paths removed. A pid reused by another process keeps its directory until that one ends too."""
    temp_dir = temp_dir or tempfile.gettempdir()
    removed = []
    for name in os.listdir(temp_dir):
        if not name.startswith(CACHE_PREFIX):
            continue
        pid_text = name[len(CACHE_PREFIX):].split("-", 1)[0]
        if not pid_text.isdigit() or _process_exists(int(pid_text)):
            continue  # a name without a pid (nothing to tell), or a live service's
        path = os.path.join(temp_dir, name)
        shutil.rmtree(path, ignore_errors=True)  # another user's is not ours to remove: left there
        if not os.path.exists(path):
            removed.append(path)
    return removed


def _process_exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class Solver:
    def __init__(self, settings: Settings, store: Store, metrics: Metrics):
        self.settings, self.store, self.metrics = settings, store, metrics
        self._pool: ProcessPoolExecutor | None = None
        self._quick_pool: ProcessPoolExecutor | None = None
        self._inflight: dict[tuple[str, str], asyncio.Future] = {}
        self._tasks: set[asyncio.Task] = set()
        self.queue = SolveQueue(settings.solver_processes, settings.max_queued_solves)
        self.quick_queue = SolveQueue(1, 0)
        self._warmed: LRU[str, bool] = LRU(settings.cache_entries)
        self.fault_free_cache = settings.fault_free_cache
        self._own_cache: str | None = None  # the temporary directory made here, removed at shutdown

    def start(self) -> None:
        if not self.fault_free_cache:  # unset, or set empty (as the planner reads it: no directory)
            remove_orphaned_caches()
            self._own_cache = self.fault_free_cache = tempfile.mkdtemp(prefix=f"{CACHE_PREFIX}{os.getpid()}-")
        self._pool = self._new_pool(self.settings.solver_processes, FULL_SOLVE_NICENESS)
        self._quick_pool = self._new_pool(1, QUICK_SOLVE_NICENESS)

    def _new_pool(self, processes: int, niceness: int = 0) -> ProcessPoolExecutor:
        pool = ProcessPoolExecutor(
            max_workers=processes, mp_context=multiprocessing.get_context("spawn"),
            initializer=solve_worker.init_worker, initargs=(os.getpid(), niceness, self.fault_free_cache))
        # Start and warm the workers now, so the first failure does not pay for process start-up.
        for _ in range(processes):
            pool.submit(solve_worker.warm_up)
        return pool

    def shutdown(self) -> None:
        for task in self._tasks:
            task.cancel()
        for name in ("_pool", "_quick_pool"):
            pool = getattr(self, name)
            setattr(self, name, None)
            if pool is not None:
                _stop_pool(pool)
        if self._own_cache is not None:
            shutil.rmtree(self._own_cache, ignore_errors=True)
            self._own_cache = None

    def _replace_pool(self, broken: ProcessPoolExecutor, why: str) -> None:
        """A pool whose process died (kill, out of memory) or overran is useless: start a fresh one.
        Only the first caller replaces it; the others see the pool already changed."""
        for name in ("_pool", "_quick_pool"):
            if getattr(self, name) is broken:
                log.error("solve pool replaced", extra={"reason": why, "pool": name.strip("_")})
                self.metrics.pool_restarts.inc()
                niceness = FULL_SOLVE_NICENESS if name == "_pool" else QUICK_SOLVE_NICENESS
                setattr(self, name, self._new_pool(broken._max_workers, niceness))
                # Off the event loop: joining the stopped processes may take a moment.
                asyncio.get_running_loop().run_in_executor(None, _stop_pool, broken)

    def warm_job(self, job_id: str, job: JobSpec) -> None:
        """Compute the job's fault-free plan in the quick process now (once per job), behind any quick
        plan workers wait for, so its first failure's quick plan does not pay for it."""
        if self._warmed.get(job_id) or self._quick_pool is None:
            return
        self._warmed.put(job_id, True)
        task = asyncio.create_task(self._warm(job_id, job))
        task.solve_key = (job_id, None)  # type: ignore[attr-defined]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _warm(self, job_id: str, job: JobSpec) -> None:
        await self.quick_queue.acquire(PRECOMPUTE, None, job_id)
        try:
            pool = self._quick_pool
            if pool is not None:
                await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(
                    pool, solve_worker.warm_job, job.model_dump_json()), self.settings.fault_free_deadline_s)
        except Exception as exc:  # only a head start: the quick plan computes it anyway
            log.info("job warm-up skipped", extra={"job_id": job_id, "error": f"{type(exc).__name__}: {exc}"})
        finally:
            self.quick_queue.release()

    def forget_job(self, job_id: str) -> None:
        """The job was deleted: drop its queued solves (a running one ends with its time limit)."""
        self._warmed.pop(job_id, None)
        for task in list(self._tasks):
            if getattr(task, "solve_key", (None,))[0] == job_id:
                task.cancel()

    def in_flight(self, job_id: str, class_key: str) -> bool:
        return (job_id, class_key) in self._inflight

    def ensure(self, job_id: str, job: JobSpec, class_key: str, canonical_failed: tuple,
               priority: int = CLIENT, refuse: bool = True) -> asyncio.Future:
        """The (shared) future of this class's solve; resolves to the final status: done | failed.

        `priority`: `api.solve_queue`'s, most urgent first. A new CLIENT solve is refused with
        `QueueFull` when the queue is full, unless `refuse` is False. A quick class key is solved
        by the quick process (never refused)."""
        key = (job_id, class_key)
        queue = self.quick_queue if _for_quick_process(class_key, canonical_failed) else self.queue
        future = self._inflight.get(key)
        if future is not None:
            queue.promote(future, priority)
            return future
        if refuse and queue is self.queue:
            self.queue.check(priority)
        future = asyncio.get_running_loop().create_future()
        self._inflight[key] = future
        self.metrics.solves_in_flight.inc()
        task = asyncio.create_task(self._run(key, job, canonical_failed, future, priority))
        task.solve_key = key  # type: ignore[attr-defined]
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return future

    async def _solve(self, key: tuple[str, str], job: JobSpec, failed: tuple, priority: int,
                     token: asyncio.Future) -> tuple[dict, str]:
        """Wait for a slot (of the quick process for a quick class), then solve in that pool."""
        in_quick = _for_quick_process(key[1], failed)
        queue = self.quick_queue if in_quick else self.queue
        await queue.acquire(priority, token, key[0])
        try:
            return await self._solve_now(job, failed, in_quick, is_quick(key[1]))
        finally:
            queue.release()

    async def _solve_now(self, job: JobSpec, failed: tuple, in_quick: bool = False, quick: bool = False
                         ) -> tuple[dict, str]:
        """The solve in the pool (a slot is ours, so it starts at once), bounded by
        RECYCLE_SOLVE_DEADLINE_S; a pool that breaks under it is replaced and the solve tried once
        more (a second death is the solve's own doing)."""
        deadline = self.settings.deadline_s
        for attempt in (1, 2):
            pool = self._quick_pool if in_quick else self._pool
            if pool is None:
                raise RuntimeError("solver not started")
            await self._make_fault_free_plan(pool, job)
            try:
                loop, failed_lists = asyncio.get_running_loop(), [list(w) for w in failed]
                future = loop.run_in_executor(pool, solve_worker.quick_solve_class, job.model_dump_json(),
                                              failed_lists) if quick else loop.run_in_executor(
                    pool, solve_worker.solve_class, job.model_dump_json(), failed_lists,
                    self.settings.solve_time_limit_s, self.settings.use_cp, 0)
                return await asyncio.wait_for(future, deadline)
            except TimeoutError:
                raise self._overran(pool, "the solve", deadline, "RECYCLE_SOLVE_DEADLINE_S") from None
            except BrokenProcessPool:
                self._replace_pool(pool, "a solve process died")
                if attempt == 2:
                    raise solve_worker.SolveFailed(
                        "the solve process died twice while planning this class (killed, or out of "
                        "memory)") from None
        raise AssertionError("unreachable")

    async def _make_fault_free_plan(self, pool: ProcessPoolExecutor, job: JobSpec) -> None:
        """Have `pool` make the job's fault-free plan first, under a deadline of its own
        (RECYCLE_FAULT_FREE_DEADLINE_S): it is made once per job and takes tens of seconds on a large
        pipeline with uneven stages (45 s for 8 x 32 x 256), which inside a solve's deadline (2 x the
        limit + 30 s) made the job's first solves fail. Once made it is a read of the shared
        directory or the process's memory (the planner decides, so a file of another method counts
        as missing)."""
        limit = self.settings.fault_free_deadline_s
        try:
            await asyncio.wait_for(asyncio.get_running_loop().run_in_executor(
                pool, solve_worker.warm_job, job.model_dump_json()), limit)
        except TimeoutError:
            raise self._overran(pool, "the job's fault-free plan", limit,
                                "RECYCLE_FAULT_FREE_DEADLINE_S") from None
        except BrokenProcessPool:
            pass  # the solve below meets the broken pool and replaces it

    def _overran(self, pool: ProcessPoolExecutor, what: str, limit: float, setting: str) -> Exception:
        """Stop `pool` (its process runs on) and say what overran which deadline."""
        self._replace_pool(pool, f"{what} overran its deadline of {limit:g} s")
        return solve_worker.SolveFailed(
            f"{what} overran its deadline of {limit:g} s ({setting}) and was stopped")

    async def _run(self, key: tuple[str, str], job: JobSpec, failed: tuple, future: asyncio.Future,
                   priority: int) -> None:
        job_id, class_key = key
        started = time.perf_counter()
        status = "failed"
        try:
            try:
                summary, timeline = await self._solve(key, job, failed, priority, future)
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


def _for_quick_process(class_key: str, canonical_failed: tuple) -> bool:
    """A quick plan, or the failure-free class (the fault-free plan: nothing to search)."""
    return is_quick(class_key) or not canonical_failed


def _stop_pool(pool: ProcessPoolExecutor) -> None:
    processes = list((getattr(pool, "_processes", None) or {}).values())
    pool.shutdown(wait=False, cancel_futures=True)
    for process in processes:  # a CP-SAT solve may run for minutes: do not wait for it
        process.kill()
    for process in processes:
        process.join(timeout=5)
