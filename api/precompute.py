"""Precompute operations: plan every canonical failure class of a job up to k failures.

Progress lives in the `operations` row (done/total), so it is readable while the run goes and
survives a restart; ETA comes from this process's own rate since it (re)started the run. A run
resumes after a restart: classes already solved are read from the store and skipped.
"""

from __future__ import annotations

import asyncio
import time
from math import comb

from api import logs
from api.materials import failed_key
from api.problems import Problem
from api.solve_queue import PRECOMPUTE
from api.solver import Solver, in_thread
from api.store import JobRow, Store
from planner.failures import TooManyClasses, enumerate_failure_classes
from planner.spec import JobSpec, Worker

log = logs.get("precompute")


def useful_failures(job: JobSpec, max_failures: int) -> int:
    """More failures than (D - 1) x S leave some stage without a survivor: no further classes."""
    return min(max_failures, (job.pipelines - 1) * job.stages)


def classes_at_least(job: JobSpec, max_failures: int) -> int:
    """A lower bound on the class count, by arithmetic: with D >= 2 every non-empty stage subset of
    size <= k failed on one pipeline is a class of its own (plus the empty set)."""
    k = useful_failures(job, max_failures)
    return 1 + sum(comb(job.stages, size) for size in range(1, min(k, job.stages) + 1))


def _count(n: int) -> str:
    digits = str(n)
    return digits if len(digits) <= 12 else f"about 10^{len(digits) - 1}"


def failure_classes(job: JobSpec, max_failures: int, cap: int) -> list[tuple[Worker, ...]]:
    """Every class to plan, refused by arithmetic before anything is allocated when there are more
    than `cap`; the planner's enumeration then stops at the cap too."""
    k = useful_failures(job, max_failures)
    if k <= 0:  # one pipeline (or none useful): only the failure-free plan
        return [()]
    at_least = classes_at_least(job, k)
    if at_least > cap:
        raise Problem(422, f"max_failures: {max_failures} gives at least {_count(at_least)} failure classes "
                      f"for a {job.pipelines} x {job.stages} job, more than the cap of {cap} "
                      "(RECYCLE_MAX_PRECOMPUTE_CLASSES); ask for fewer failures", field="max_failures")
    try:
        return list(enumerate_failure_classes(job, k, max_classes=cap))
    except TooManyClasses:
        raise Problem(422, f"max_failures: {max_failures} gives more than {cap} failure classes for a "
                      f"{job.pipelines} x {job.stages} job, at least {cap + 1} "
                      "(RECYCLE_MAX_PRECOMPUTE_CLASSES); ask for fewer failures",
                      field="max_failures") from None


class Precomputer:
    def __init__(self, store: Store, solver: Solver, parallel: int, max_classes: int):
        self.store, self.solver = store, solver
        self.parallel, self.max_classes = parallel, max_classes
        self._tasks: dict[str, asyncio.Task] = {}
        self._job_of: dict[str, str] = {}  # operation -> job, for the running ones
        self._rate: dict[str, tuple[float, int]] = {}  # operation -> (resumed at, done at resume)

    async def start(self, job: JobRow, max_failures: int) -> dict:
        classes = await in_thread(failure_classes, job.job, max_failures, self.max_classes)
        done = await in_thread(self.store.done_classes, job.id)
        already = sum(1 for c in classes if failed_key(c) in done)
        op = await in_thread(self.store.create_operation, job.id, max_failures, len(classes), already)
        self._launch(op["id"], job, classes)
        return op

    async def resume_all(self, jobs: dict[str, JobRow]) -> None:
        for op in await in_thread(self.store.running_operations):
            job = jobs.get(op["job_id"])
            if job is None:
                continue
            classes = await in_thread(failure_classes, job.job, op["max_failures"], self.max_classes)
            log.info("precompute resumed",
                     extra={"operation": op["id"], "done": op["done"], "total": op["total"]})
            self._launch(op["id"], job, classes)

    def _launch(self, op_id: str, job: JobRow, classes: list[tuple[Worker, ...]]) -> None:
        self._tasks[op_id] = asyncio.create_task(self._run(op_id, job, classes))
        self._job_of[op_id] = job.id

        def done(_: asyncio.Task) -> None:
            self._tasks.pop(op_id, None)
            self._job_of.pop(op_id, None)

        self._tasks[op_id].add_done_callback(done)

    def forget_job(self, job_id: str) -> None:
        """The job was deleted (its operations are marked cancelled in the same transaction): stop."""
        for op_id in [o for o, j in self._job_of.items() if j == job_id]:
            task = self._tasks.pop(op_id, None)
            if task is not None:
                task.cancel()

    def eta_s(self, op: dict) -> float | None:
        rate = self._rate.get(op["id"])
        if op["status"] != "running" or rate is None:
            return None
        started, done_then = rate
        solved = op["done"] - done_then
        if solved <= 0:
            return None
        return round((time.monotonic() - started) / solved * (op["total"] - op["done"]), 3)

    async def cancel(self, op_id: str) -> None:
        task = self._tasks.pop(op_id, None)
        await in_thread(self._mark_cancelled, op_id)
        if task is not None:
            task.cancel()

    def _mark_cancelled(self, op_id: str) -> None:
        self.store.update_operation(op_id, status="cancelled")

    def shutdown(self) -> None:
        for task in list(self._tasks.values()):
            task.cancel()

    async def _run(self, op_id: str, job: JobRow, classes: list[tuple[Worker, ...]]) -> None:
        try:
            done_keys = await in_thread(self.store.done_classes, job.id)
            todo = [c for c in classes if failed_key(c) not in done_keys]
            done = len(classes) - len(todo)
            failures = 0
            await in_thread(lambda: self.store.update_operation(op_id, done=done))
            self._rate[op_id] = (time.monotonic(), done)
            running: set[asyncio.Future] = set()
            queue = list(reversed(todo))
            while queue or running:
                while queue and len(running) < self.parallel:
                    cls = queue.pop()
                    key = failed_key(cls)
                    await in_thread(self.store.ensure_solve, job.id, key)
                    running.add(asyncio.ensure_future(self.solver.ensure(job.id, job.job, key, cls,
                                                                               PRECOMPUTE)))
                finished, running = await asyncio.wait(running, return_when=asyncio.FIRST_COMPLETED)
                for fut in finished:
                    if fut.result() == "done":
                        done += 1
                    elif fut.result() == "failed":
                        failures += 1
                    else:  # the solve was aborted (pool broken): stop; a restart resumes
                        raise RuntimeError(f"a solve ended as {fut.result()}")
                await in_thread(lambda d=done: self.store.update_operation(op_id, done=d))
            error = f"{failures} failure classes could not be planned" if failures else None
            await in_thread(lambda: self.store.update_operation(op_id, status="done", error=error))
            log.info("precompute finished", extra={"operation": op_id, "done": done, "failed": failures})
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            log.error("precompute failed", exc_info=exc, extra={"operation": op_id})
            message = f"{type(exc).__name__}: {exc}"
            await in_thread(lambda: self.store.update_operation(op_id, status="failed", error=message))
        finally:
            self._rate.pop(op_id, None)
