"""The coordinator: membership generations per job, heartbeats, failures, rejoins, long-polls.

The service owns each job's generation. A failure report, a rejoin or a missed heartbeat moves the
job to generation G+1 with the new failure set and its plan (stored if precomputed, else solved; the
generation is `solving` until the plan exists). Long-polls for "after G" wake on every change and
answer once generation > G is settled (`running` with a plan; `waiting` when a stage has lost every
worker: the job waits for a rejoin to that stage, after which every worker restores the newest
checkpoint; `stopped` when no plan exists). Heartbeats stay in memory (hundreds per second);
registrations and generations are stored.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field

from api import logs
from api.lru import LRU
from api.metrics import Metrics
from api.plan_service import PlanService
from api.problems import Problem
from api.settings import Settings
from api.solve_queue import COORDINATOR
from api.solver import in_thread
from api.store import GenerationConflict, JobRow, Store
from api.tokens import Caller, new_registration
from api.watchdog import confirm_s, lost_workers
from planner.spec import SpecError, Worker

log = logs.get("coordinator")


@dataclass
class Membership:
    job: JobRow
    generation: int = 1
    failed: tuple[Worker, ...] = ()
    plan_id: str | None = None
    status: str = "solving"  # solving | running | waiting | stopped
    reason: str | None = None
    iteration_ms: float | None = None
    last_seen: dict[Worker, float] = field(default_factory=dict)
    suspects: dict[Worker, float] = field(default_factory=dict)
    """Workers a peer reported failed while their heartbeats were fresh -> time of the report; the
    report stands once they go silent, or when no new generation came long after (too slow)."""
    sessions: dict[Worker, str | None] = field(default_factory=dict)
    """Hash of the registration id of the process each worker registered as (None: no binding)."""
    started_at: float | None = None
    """When the first worker registered (or the job was loaded with registrations)."""
    all_registered: bool = False
    changed_at: float = field(default_factory=time.monotonic)
    """When this generation began (or was loaded)."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    deleted: bool = False

    def notify(self) -> None:
        """Wake every long-poll waiting on this job; later waiters get a fresh event."""
        event, self.changed = self.changed, asyncio.Event()
        event.set()


def _idle(m: Membership) -> bool:
    return m.status != "solving" and all(w in m.failed for w in m.last_seen)


def lost_stages(pipelines: int, stages: int, failed: tuple[Worker, ...]) -> list[int]:
    """Stages whose every worker is in the failure set."""
    dead = set(failed)
    return [s for s in range(stages) if all((p, s) in dead for p in range(pipelines))]


class Coordinator:
    def __init__(self, settings: Settings, store: Store, plans: PlanService, metrics: Metrics):
        self.settings, self.store, self.plans, self.metrics = settings, store, plans, metrics
        # Bounded: a job nobody is running (no live registered worker, nothing solving) may go; it is
        # loaded again from the store when a worker or client comes back.
        self._members: LRU[str, Membership] = LRU(settings.cache_entries, _idle)
        self._loading: dict[str, asyncio.Lock] = {}
        self._watchdog: asyncio.Task | None = None
        self.closing = False

    # --------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._watchdog = asyncio.create_task(self._watch())

    def shutdown(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()

    def close_polls(self) -> None:
        """The server is stopping: answer every long-poll now (204) rather than drop them."""
        self.closing = True
        for m in list(self._members.values()):
            m.notify()

    def forget_job(self, job_id: str) -> None:
        m = self._members.pop(job_id, None)
        if m is not None:
            m.deleted = True
            m.notify()
        self.metrics.forget_job(job_id)

    async def membership(self, job: JobRow) -> Membership:
        m = self._members.get(job.id)
        if m is not None:
            return m
        lock = self._loading.setdefault(job.id, asyncio.Lock())
        try:
            async with lock:
                return await self._load(job)
        finally:
            if not lock.locked():
                self._loading.pop(job.id, None)

    async def _load(self, job: JobRow) -> Membership:
        m = self._members.get(job.id)
        if m is not None:
            return m
        stored = await in_thread(self.store.load_membership, job.id)
        registered = await in_thread(self.store.registrations, job.id)
        now = time.monotonic()  # after a restart every registered worker gets a full timeout of grace
        m = Membership(job=job, last_seen={w: now for w in registered},
                       sessions={w: info["session"] for w, info in registered.items()},
                       started_at=now if registered else None)
        if stored is None:
            await self._settle(m, (), cause="job started")
        else:
            m.generation, m.failed = stored["generation"], tuple(stored["failed"])
            m.plan_id, m.status, m.reason = stored["plan_id"], stored["status"], stored["reason"]
            if m.status == "solving" or (m.status == "running" and m.plan_id):
                await self._settle(m, m.failed, cause=m.reason, bump=False)
        self._members.put(job.id, m)
        self._publish(m)
        return m

    # ------------------------------------------------------------------------------ transitions
    async def _settle(self, m: Membership, failed: tuple[Worker, ...], cause: str | None,
                      bump: bool = False) -> None:
        """Set the failure set and its plan (caller holds `m.lock` or owns `m` exclusively)."""
        if bump:
            m.generation += 1
            m.suspects.clear()  # reports were about the old generation's groups
            m.changed_at = time.monotonic()
        m.failed = tuple(sorted(set(failed)))
        # Until its plan is known the generation is solving: a reader between here and the plan
        # lookup's await would otherwise see the new failures with the old plan, running.
        m.reason, m.iteration_ms, m.status, m.plan_id = cause, None, "solving", None
        lost = lost_stages(m.job.job.pipelines, m.job.job.stages, m.failed)
        if lost:
            # Not the end of the job: a worker that rejoins such a stage brings it back, and every
            # worker then restores the newest checkpoint (the executor's daemon does the restore).
            m.status, m.plan_id = "waiting", None
            m.reason = (f"{cause}; stage {', '.join(map(str, lost))} has no alive worker: waiting for a "
                        "worker to rejoin it, then every worker restores the newest checkpoint")
        else:
            await self._request_plan(m)
        try:
            await in_thread(self.store.save_membership, m.job.id, m.generation, list(m.failed), m.plan_id,
                            m.status, m.reason, m.generation - 1 if bump else m.generation)
        except GenerationConflict as exc:  # another coordinator moved it (the lease prevents it)
            log.error("generation conflict", extra={"job_id": m.job.id, "error": str(exc)})
            if self._members.get(m.job.id) is m:
                self._members.pop(m.job.id, None)
            m.notify()
            raise Problem(409, f"{exc}; retry", field="job_id") from None
        self._publish(m)
        m.notify()

    async def _request_plan(self, m: Membership) -> None:
        try:
            plan, future = await self.plans.request(m.job, list(m.failed), COORDINATOR)
        except SpecError as exc:
            m.status, m.plan_id, m.reason = "stopped", None, str(exc)
            return
        m.plan_id = plan.id
        if future is None:
            self._apply_plan(m, plan.status, plan.summary, plan.error)
        else:
            m.status = "solving"
            asyncio.ensure_future(self._when_solved(m, m.generation, plan.id, future))

    def _apply_plan(self, m: Membership, status: str, summary: dict | None, error: str | None) -> None:
        if status == "done" and summary is not None:
            m.status, m.iteration_ms = "running", summary.get("objective_ms")
        else:
            m.status = "stopped"
            m.reason = f"no plan for failure set {[list(w) for w in m.failed]}: {error or status}"

    async def _when_solved(self, m: Membership, generation: int, plan_id: str,
                           future: asyncio.Future) -> None:
        await asyncio.shield(future)
        async with m.lock:
            if m.deleted or m.generation != generation or m.plan_id != plan_id:
                return  # the membership moved on while this plan was solving
            plan = await self.plans.get(m.job, plan_id)
            if plan.status == "pending":  # solve aborted; retry rather than leave workers waiting
                await self._settle(m, m.failed, m.reason)
                return
            self._apply_plan(m, plan.status, plan.summary, plan.error)
            await in_thread(self.store.save_membership, m.job.id, m.generation, list(m.failed), m.plan_id,
                            m.status, m.reason)
            log.info("generation ready", extra={"job_id": m.job.id, "generation": m.generation,
                                                "status": m.status})
            m.notify()

    async def _change(self, m: Membership, add: set[Worker], remove: set[Worker], cause: str) -> None:
        async with m.lock:  # the set is computed here: one taken before waiting would undo others'
            failed = (set(m.failed) | add) - remove
            if failed == set(m.failed):
                return
            await self._settle(m, tuple(failed), cause, bump=True)
            log.info("generation changed", extra={"job_id": m.job.id, "generation": m.generation,
                                                  "failed": [list(w) for w in m.failed], "cause": cause,
                                                  "status": m.status})

    # ------------------------------------------------------------------------------------ routes
    def check_worker(self, job: JobRow, worker: Worker, field_name: str = "worker") -> None:
        p, s = worker
        if not (0 <= p < job.job.pipelines and 0 <= s < job.job.stages):
            raise Problem(403, f"worker [{p}, {s}] is not part of job {job.id} ({job.job.pipelines} "
                          f"pipelines x {job.job.stages} stages); refused", field=field_name)

    async def heartbeat(self, job: JobRow, worker: Worker, address: str | None, pid: int | None,
                        caller: Caller) -> dict:
        self.check_worker(job, worker)
        m = await self.membership(job)
        now = time.monotonic()
        minted = new_hash = None
        stored = m.sessions.get(worker)
        if not caller.admin and (stored is None or not caller.owns(stored)):
            seen = m.last_seen.get(worker)
            if stored is not None and worker not in m.failed and seen is not None \
                    and now - seen <= self.settings.heartbeat_timeout_s:
                raise Problem(409, f"worker {list(worker)} is registered by another process that is still "
                              "beating (X-Recycle-Registration differs); a restarted worker is let in once "
                              f"the old one has been silent for {self.settings.heartbeat_timeout_s:g} s",
                              field="worker")
            minted, new_hash = new_registration()
        if new_hash is not None or worker not in m.last_seen or address is not None or pid is not None:
            await in_thread(self.store.register_worker, job.id, worker, address, pid, new_hash)
        if new_hash is not None:
            m.sessions[worker] = new_hash
        m.last_seen[worker] = now
        if m.started_at is None:
            m.started_at = now
        self._publish(m)
        out = self._state(m, worker)
        if minted is not None:
            out["registration"] = minted
        return out

    def _check_reporter(self, m: Membership, caller: Caller, worker: Worker, what: str) -> None:
        """A worker token acts as one registered worker: the one whose registration id it sends."""
        if not caller.admin and (m.sessions.get(worker) is None or not caller.owns(m.sessions[worker])):
            raise Problem(403, f"{what} {list(worker)} is not registered by this process: register with a "
                          "heartbeat and send its registration id as X-Recycle-Registration",
                          field="reporter" if what == "reporter" else "worker")

    async def report_failure(self, job: JobRow, worker: Worker, reporter: Worker | None,
                             reason: str | None, caller: Caller, generation: int | None = None) -> dict:
        self.check_worker(job, worker)
        if reporter is not None:
            self.check_worker(job, reporter, "reporter")
        elif not caller.admin:
            raise Problem(403, "a worker token reports as a worker: give `reporter` (this worker)",
                          field="reporter")
        m = await self.membership(job)
        if reporter is not None:
            self._check_reporter(m, caller, reporter, "reporter")
        if generation is not None and generation < m.generation:
            return self._state(m, worker)  # about an older generation's groups: already replanned
        seen = m.last_seen.get(worker)
        fresh = seen is not None and time.monotonic() - seen < 1.5 * self.settings.heartbeat_interval_s
        if reporter is not None and reporter != worker and fresh and worker not in m.failed:
            # A gloo group breaks for every member when one dies, so a survivor can blame a live peer.
            # A peer's report therefore only stands once the reported worker misses its next beats, or
            # no new generation came long after (it is too slow); the watchdog decides. A report from
            # outside the job (operator, launcher) or by a worker about itself is final.
            now = time.monotonic()
            at = m.suspects.get(worker)
            if at is None or at - m.changed_at < confirm_s(self.settings):
                m.suspects[worker] = now  # a repeated report, now well into the generation, counts
            return self._state(m, worker)
        if worker not in m.failed:
            by = f" by {list(reporter)}" if reporter else ""
            await self._change(m, {worker}, set(), f"worker {list(worker)} reported failed{by}"
                               + (f": {reason}" if reason else ""))
        return self._state(m, worker)

    async def report_rejoin(self, job: JobRow, worker: Worker, caller: Caller) -> dict:
        self.check_worker(job, worker)
        m = await self.membership(job)
        self._check_reporter(m, caller, worker, "worker")
        if worker not in m.failed:
            raise Problem(409, f"worker {list(worker)} is not in the failure set of generation "
                          f"{m.generation}; nothing to rejoin", field="worker")
        m.last_seen[worker] = time.monotonic()
        await self._change(m, set(), {worker}, f"worker {list(worker)} rejoined")
        return self._state(m, worker)

    def _state(self, m: Membership, worker: Worker | None = None) -> dict:
        out = {
            "job_id": m.job.id,
            "generation": m.generation,
            "status": m.status,
            "reason": m.reason,
            "failed": [list(w) for w in m.failed],
            "plan_id": m.plan_id,
            "iteration_ms": m.iteration_ms,
            "heartbeat_interval_s": self.settings.heartbeat_interval_s,
            "heartbeat_timeout_s": self.settings.heartbeat_timeout_s,
        }
        if worker is not None:
            out["worker"] = list(worker)
            out["excluded"] = worker in m.failed
        return out

    async def state(self, job: JobRow) -> dict:
        m = await self.membership(job)
        registered = await in_thread(self.store.registrations, job.id)
        now = time.monotonic()
        out = self._state(m)
        out["workers"] = [
            {"worker": list(w), "address": info["address"], "pid": info["pid"],
             "failed": w in m.failed,
             "seconds_since_heartbeat": round(now - m.last_seen[w], 3) if w in m.last_seen else None}
            for w, info in sorted(registered.items())]
        out["spec"] = job.job.filled()
        return out

    async def assignment(self, job: JobRow, worker: Worker, after: int, wait_s: float) -> bytes | None:
        """The assignment of generation > `after` once it is settled, or None when `wait_s` passes."""
        self.check_worker(job, worker)
        m = await self.membership(job)
        deadline = time.monotonic() + wait_s
        self.metrics.long_polls.inc()
        try:
            while not (m.generation > after and m.status != "solving"):
                event = m.changed
                remaining = deadline - time.monotonic()
                if m.deleted or self.closing or remaining <= 0:
                    return None
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except TimeoutError:
                    return None
        finally:
            self.metrics.long_polls.dec()
        return await self._assignment_body(m, worker)

    async def _assignment_body(self, m: Membership, worker: Worker) -> bytes:
        generation, status, plan_id, failed = m.generation, m.status, m.plan_id, m.failed
        reason, iteration_ms = m.reason, m.iteration_ms
        instructions = b"null"
        if worker in failed:
            status = "excluded"
            reason = (f"worker {list(worker)} is in the failure set of generation {generation}; "
                      "report a rejoin (POST .../rejoins) to come back")
        elif status == "running" and plan_id is not None:
            plan = await self.plans.get(m.job, plan_id)
            instructions = await self.plans.stream(m.job, plan, worker)
        job = m.job.job
        dead = set(failed)
        head = {
            "job_id": m.job.id,
            "generation": generation,
            "status": status,
            "reason": reason,
            "plan_id": plan_id,
            "failed": [list(w) for w in failed],
            "worker": list(worker),
            "alive": [[p, s] for p in range(job.pipelines) for s in range(job.stages) if (p, s) not in dead],
            "iteration_ms": iteration_ms,
            "heartbeat_interval_s": self.settings.heartbeat_interval_s,
            "heartbeat_timeout_s": self.settings.heartbeat_timeout_s,
        }
        # The stream is cached as JSON bytes: splice it in rather than parse and re-serialize it.
        head_json = json.dumps(head, separators=(",", ":")).encode()
        return head_json[:-1] + b',"instructions":' + instructions + b"}"

    # ---------------------------------------------------------------------------------- watchdog
    async def _watch(self) -> None:
        period = min(0.25, self.settings.heartbeat_timeout_s / 4)
        while True:
            await asyncio.sleep(period)
            for m in list(self._members.values()):
                lost, cause = lost_workers(m, self.settings, time.monotonic())
                if lost:
                    try:
                        await self._change(m, lost, set(), cause)
                    except Exception as exc:  # keep watching the other jobs
                        log.error("watchdog transition failed", exc_info=exc, extra={"job_id": m.job.id})
                self._publish(m)

    def _publish(self, m: Membership) -> None:
        now = time.monotonic()
        alive = sum(1 for w, seen in m.last_seen.items()
                    if w not in m.failed and now - seen <= self.settings.heartbeat_timeout_s)
        self.metrics.generation.labels(m.job.id).set(m.generation)
        self.metrics.alive_workers.labels(m.job.id).set(alive)
        self.metrics.failed_workers.labels(m.job.id).set(len(m.failed))
