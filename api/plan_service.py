"""Plans for concrete failure sets: look up the stored class plan, share solves, serve materials.

A finished plan row never changes, so finished rows, concrete plans and streams are cached in memory;
the database is read once per plan, not once per request.
"""

from __future__ import annotations

import asyncio
import contextlib

from api.lru import LRU
from api.materials import MaterialCache, PlanMaterial, failed_key, loads_timeline, parse_failed_key, quick_key
from api.metrics import Metrics
from api.problems import Problem
from api.solve_queue import CLIENT, URGENT, QueueFull
from api.solver import Solver, in_thread
from api.store import JobRow, PlanRow, Store
from planner.failures import normalize
from planner.spec import Worker


class PlanService:
    def __init__(self, store: Store, solver: Solver, metrics: Metrics, cache_entries: int = 4096):
        self.store, self.solver, self.metrics = store, solver, metrics
        self.cache = MaterialCache()
        self._finished: LRU[tuple[str, str], PlanRow] = LRU(cache_entries)
        self._building: dict[tuple[str, str], asyncio.Future] = {}
        self._warming: dict[tuple[str, str], asyncio.Future] = {}

    async def request(self, job: JobRow, failed: object, priority: int = CLIENT
                      ) -> tuple[PlanRow, asyncio.Future | None]:
        """The plan of a failure set: the stored row, and the solve's future when it is not done yet.
        A new client solve while the solve queue is full raises `QueueFull` (503)."""
        canonical = normalize(job.job, failed)  # SpecError (422) names the bad worker or dead stage
        concrete = tuple(sorted(canonical.concrete_worker(w) for w in canonical.failed))
        plan = await in_thread(self.store.get_or_create_plan, job.id, failed_key(concrete), canonical.key)
        if plan.status != "pending":
            self.metrics.plan_lookups.labels("hit").inc()
            return self._remember(plan), None
        shared = self.solver.in_flight(job.id, canonical.key)
        self.metrics.plan_lookups.labels("shared" if shared else "miss").inc()
        return plan, self.solver.ensure(job.id, job.job, canonical.key, canonical.failed, priority)

    async def request_quick(self, job: JobRow, failed: object) -> tuple[PlanRow, asyncio.Future | None]:
        """The quick plan of a failure set (`api.quick_plan`: a plan resource of its own, solved by
        the quick process at once), for a coordinator whose workers have no assignment yet."""
        canonical = normalize(job.job, failed)
        concrete = tuple(sorted(canonical.concrete_worker(w) for w in canonical.failed))
        class_key = quick_key(canonical.key)
        plan = await in_thread(self.store.get_or_create_plan, job.id, quick_key(failed_key(concrete)),
                               class_key)
        if plan.status != "pending":
            return self._remember(plan), None
        return plan, self.solver.ensure(job.id, job.job, class_key, canonical.failed, URGENT)

    async def get(self, job: JobRow, plan_id: str) -> PlanRow:
        found = self._finished.get((job.id, plan_id))
        if found is not None:
            return found
        plan = await in_thread(self.store.get_plan, job.id, plan_id)
        if plan is None:
            raise Problem(404, f"job {job.id} has no plan {plan_id}", field="plan_id")
        if plan.status == "pending":
            # Nobody may be solving it (e.g. the service restarted): make sure someone is.
            canonical = normalize(job.job, parse_failed_key(plan.failed_key))
            with contextlib.suppress(QueueFull):  # queue full: still pending, a later poll tries again
                self.solver.ensure(job.id, job.job, plan.class_key, canonical.failed)
            return plan
        return self._remember(plan)

    def _remember(self, plan: PlanRow) -> PlanRow:
        if plan.status != "pending":
            self._finished.put((plan.job_id, plan.id), plan)
        return plan

    def forget_job(self, job_id: str) -> None:
        self.cache.forget_job(job_id)
        for key in [k for k in self._finished if k[0] == job_id]:
            self._finished.pop(key)

    async def material(self, job: JobRow, plan: PlanRow) -> PlanMaterial:
        """The concrete plan, built once per plan however many requests want it at the same time."""
        if plan.status != "done":
            raise Problem(409, f"plan {plan.id} is {plan.status}"
                          + (f": {plan.error}" if plan.error else "; poll it until its status is done"),
                          field="plan_id")
        cached = self.cache.plan(job.id, plan.id)
        if cached is not None:
            return cached
        key = (job.id, plan.id)
        building = self._building.get(key)
        if building is None:
            building = asyncio.ensure_future(self._build(job, plan))
            self._building[key] = building
            building.add_done_callback(lambda _: self._building.pop(key, None))
        return await asyncio.shield(building)

    async def _build(self, job: JobRow, plan: PlanRow) -> PlanMaterial:
        text = await in_thread(self.store.canonical_timeline, job.id, plan.class_key)
        if text is None:
            raise Problem(404, f"plan {plan.id} of job {job.id} is gone", field="plan_id")
        failed = parse_failed_key(plan.failed_key)

        def build() -> PlanMaterial:
            return PlanMaterial(job.job, failed, loads_timeline(text))

        material = await in_thread(build)
        self.cache.put_plan(job.id, plan.id, material)
        return material

    async def stream(self, job: JobRow, plan: PlanRow, worker: Worker) -> bytes:
        """One worker's instruction stream (JSON bytes); 404 for a worker outside the job, 409 if failed."""
        p, s = worker
        if not (0 <= p < job.job.pipelines and 0 <= s < job.job.stages):
            raise Problem(404, f"worker [{p}, {s}] is not part of job {job.id} "
                          f"({job.job.pipelines} pipelines x {job.job.stages} stages)", field="worker")
        cached = self.cache.stream(job.id, plan.id, worker)
        if cached is not None:
            return cached
        material = await self.material(job, plan)
        if worker in material.failed:
            raise Problem(409, f"worker [{p}, {s}] is in this plan's failure set and runs nothing",
                          field="worker")
        data = await in_thread(material.stream_json, worker)
        self.cache.put_stream(job.id, plan.id, worker, data)
        return data

    async def streams(self, job: JobRow, plan: PlanRow) -> dict[Worker, bytes]:
        """Every alive worker's stream of a done plan, built in one thread job (not one per worker:
        after a failure all of them are wanted at once), cached, and shared by whoever asks while
        it is being built (a warm-up and the coordinator)."""
        return await asyncio.shield(self._streams_future(job, plan))

    def warm(self, job: JobRow, plan: PlanRow) -> asyncio.Future | None:
        """A client asked for this failure set's plan ahead of time: build its streams now, so a
        worker failure that needs it serves stored bytes (issue 9's 3 s bar). The future of the
        build, None when there is nothing to build."""
        if plan.status == "done" and self.cache.plan(job.id, plan.id) is None:
            return self._streams_future(job, plan)
        return None

    def _streams_future(self, job: JobRow, plan: PlanRow) -> asyncio.Future:
        key = (job.id, plan.id)
        running = self._warming.get(key)
        if running is None:
            running = asyncio.ensure_future(self._build_streams(job, plan))
            self._warming[key] = running
            # Retrieve the outcome (a deleted job's plan is gone: nothing to warm, nothing to log).
            running.add_done_callback(lambda t: (self._warming.pop(key, None),
                                                 t.cancelled() or t.exception()))
        return running

    async def _build_streams(self, job: JobRow, plan: PlanRow) -> dict[Worker, bytes]:
        material = await self.material(job, plan)
        workers = [(p, s) for p in range(job.job.pipelines) for s in range(job.job.stages)
                   if (p, s) not in material.failed]
        found = {w: self.cache.stream(job.id, plan.id, w) for w in workers}
        missing = [w for w, data in found.items() if data is None]

        def build() -> dict[Worker, bytes]:
            built = {w: material.stream_json(w) for w in missing}
            for w, data in built.items():
                self.cache.put_stream(job.id, plan.id, w, data)
            return built

        if missing:
            found.update(await in_thread(build))
        return found  # type: ignore[return-value]
