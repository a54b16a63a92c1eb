"""The coordinator: drives each job's state machine (`api.membership`) on the event loop.

It owns what the pure state machine cannot: per-job locks, the plan solves a new generation waits
for (`api.replan`: a quick plan first, the full solve adopted later when better), long-polls woken on
every change, the watchdog task, metrics, and the answers as bytes
(`api.assignment`). Persistence (membership rows with compare-and-swap on the generation,
registrations, resume after a restart) is `api.membership_store`. Heartbeats stay in memory.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

from api import gc_pauses, logs
from api.assignment import Payload, StateBytes
from api.lru import LRU
from api.membership import Membership, Timeouts
from api.membership_store import MembershipStore, Record
from api.metrics import Metrics
from api.plan_service import PlanService
from api.problems import Problem
from api.replan import Replanning
from api.settings import Settings
from api.store import GenerationConflict, JobRow, Store
from api.tokens import Caller, new_registration
from api.turns import Turns
from planner.spec import Worker

log = logs.get("coordinator")

ANSWERS_PER_TURN, ANSWER_BUDGET_S, ANSWER_BUDGET_MAX_S, ANSWERS_HURRY_AFTER_S = 128, 0.02, 0.05, 1.0
"""Long-poll answers written per event-loop iteration (`api.turns`): at most 128, for 20 ms of CPU
or as long as the loop spent on everything else since the last slice, up to 50 ms; whatever still
waits 1 s into the wake-up goes at once. After a failure at 4,096 daemons, 4,095 answers (7.3 KB
each, ~0.15 ms of server each) went out in one iteration while beats waited unread; 20-50 ms keeps
a beat's wait under the 100 ms bar while a busy loop still gives the answers about half its time.
The hurry keeps the "all hold < 3 s" bar on a server the box starves: the beats, read every
iteration, then took ~80 % of each and the wake-up 12-17 s (load 7-10)."""


@dataclass
class Live:
    """One coordinated job: its state machine and the event loop's side of it."""

    job: JobRow
    m: Membership
    records: dict[Worker, Record] = field(default_factory=dict)
    """What the store holds for each registration (a beat writes only what changes)."""
    changed: asyncio.Event = field(default_factory=asyncio.Event)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    deleted: bool = False
    payload: Payload | None = None
    ready: asyncio.Future | None = None
    """Resolves once `payload` holds the generation's instruction streams."""
    state_bytes: StateBytes = field(default_factory=StateBytes)

    def notify(self) -> None:
        """Wake every long-poll waiting on this job; later waiters get a fresh event."""
        event, self.changed = self.changed, asyncio.Event()
        event.set()


class Coordinator(Replanning):
    def __init__(self, settings: Settings, store: Store, plans: PlanService, metrics: Metrics):
        self.settings, self.plans, self.metrics = settings, plans, metrics
        self.persist = MembershipStore(store)
        self.timeouts = Timeouts.of(settings)
        # Bounded: a job nobody is running (no live registered worker, nothing solving) may go; it is
        # loaded again from the store when a worker or client comes back.
        self._members: LRU[str, Live] = LRU(settings.cache_entries, lambda live: live.m.idle())
        self._loading: dict[str, asyncio.Lock] = {}
        self._watchdog: asyncio.Task | None = None
        self.closing = False
        self.turns: Turns | None = None
        if settings.slice_answers:
            self.turns = Turns(ANSWERS_PER_TURN, ANSWER_BUDGET_S, ANSWER_BUDGET_MAX_S, ANSWERS_HURRY_AFTER_S)
            self.turns.drained = lambda answers, seconds, hurried: log.info("answers sliced", extra={
                "answers": answers, "seconds": round(seconds, 3), "hurried": hurried})

    # --------------------------------------------------------------------------------- lifecycle
    def start(self) -> None:
        self._watchdog = asyncio.create_task(self._watch())

    def shutdown(self) -> None:
        if self._watchdog is not None:
            self._watchdog.cancel()

    def close_polls(self) -> None:
        """The server is stopping: answer every long-poll now (204) rather than drop them."""
        self.closing = True
        for live in list(self._members.values()):
            live.notify()

    def forget_job(self, job_id: str) -> None:
        live = self._members.pop(job_id, None)
        if live is not None:
            live.deleted = True
            live.notify()
        self.metrics.forget_job(job_id)

    def loaded(self, job_id: str) -> Live | None:
        """The job's live state if in memory (the heartbeat fast path answers only those)."""
        return self._members.get(job_id)

    async def live(self, job: JobRow) -> Live:
        found = self._members.get(job.id)
        if found is not None:
            return found
        lock = self._loading.setdefault(job.id, asyncio.Lock())
        try:
            async with lock:
                return await self._load(job)
        finally:
            if not lock.locked():
                self._loading.pop(job.id, None)

    async def _load(self, job: JobRow) -> Live:
        found = self._members.get(job.id)
        if found is not None:
            return found
        m, records, resume = await self.persist.load(job, self.timeouts, time.monotonic())
        live = Live(job, m, records)
        if resume is None:
            await self._settle(live, (), cause="job started")
        elif resume and not await self._resume_plan(live):
            await self._settle(live, m.failed, cause=m.reason)
        self._members.put(job.id, live)
        self._publish(live)
        return live

    # ------------------------------------------------------------------------------ transitions
    async def _settle(self, live: Live, failed: tuple[Worker, ...] | set[Worker], cause: str | None) -> None:
        """Set this generation's failure set and its plan (a job loaded or started, a solve retried;
        caller holds `live.lock` or owns `live` exclusively). A new generation is `_change`."""
        before = live.m.generation
        await self._commit(live, before, live.m.set_failed(failed, cause, time.monotonic(), bump=False))

    async def _commit(self, live: Live, before: int, needs_plan: bool) -> None:
        """After a transition of `live.m` from generation `before`: ask for the plan it needs, store
        it (compare-and-swap on `before`), publish it and wake the long-polls."""
        m = live.m
        if needs_plan:
            await self._request_plan(live)
        try:
            await self.persist.save(live.job.id, m, expected=before)
        except GenerationConflict as exc:  # another coordinator moved it (the lease prevents it)
            log.error("generation conflict", extra={"job_id": live.job.id, "error": str(exc)})
            if self._members.get(live.job.id) is live:
                self._members.pop(live.job.id, None)
            live.notify()
            raise Problem(409, f"{exc}; retry", field="job_id") from None
        self._publish(live)
        self._settled(live)

    def _settled(self, live: Live) -> None:
        """A generation's plan is decided: serialize its answers once, then wake the long-polls; the
        first that needs a stream fetches every stream in one go (the others wait for that, not for
        each other). Nobody polling (a job just loaded): nothing is built."""
        m = live.m
        if m.settled():
            live.payload, live.ready = Payload(live.job.id, m), None
            gc_pauses.wake_up(live.job.job.pipelines * live.job.job.stages)
        live.notify()

    async def _fill(self, live: Live, payload: Payload) -> None:
        workers = live.job.job.pipelines * live.job.job.stages
        gc_pauses.wake_up(workers)  # building the streams allocates as much as sending them
        plan = await self.plans.get(live.job, live.m.plan_id)
        payload.streams = await self.plans.streams(live.job, plan)
        gc_pauses.wake_up(workers)  # the answers that waited for the streams go out now

    async def _change(self, live: Live, add: set[Worker], remove: set[Worker], cause: str) -> None:
        async with live.lock:  # the set is computed here: one taken before waiting would undo others'
            m = live.m
            before = m.generation
            needs_plan = m.change((set(m.failed) | add) - remove, cause, time.monotonic())
            if needs_plan is None:
                return
            await self._commit(live, before, needs_plan)
            log.info("generation changed", extra={"job_id": live.job.id, "generation": m.generation,
                                                  "failed": [list(w) for w in m.failed], "cause": cause,
                                                  "status": m.status})

    # ------------------------------------------------------------------------------------ routes
    def check_worker(self, job: JobRow, worker: Worker, field_name: str = "worker") -> None:
        p, s = worker
        if not (0 <= p < job.job.pipelines and 0 <= s < job.job.stages):
            raise Problem(403, f"worker [{p}, {s}] is not part of job {job.id} ({job.job.pipelines} "
                          f"pipelines x {job.job.stages} stages); refused", field=field_name)

    @staticmethod
    def _owner(m: Membership, worker: Worker, caller: Caller) -> bool:
        stored = m.sessions.get(worker)
        return caller.admin or (stored is not None and caller.owns(stored))

    def beat_now(self, job_id: str, worker: Worker, caller: Caller) -> bytes | None:
        """A heartbeat that changes nothing stored (a registered worker, beating as the process that
        registered it, sending no body), answered without the database or the framework; None:
        anything else, for `heartbeat` to answer.

        Also called on the heartbeat thread (`api.beat_loop`), so it only reads the membership and
        overwrites the beat time of a worker already in `last_seen` (a new key would change the
        dict's size under the watchdog's iteration on the main thread)."""
        live = self._members.get(job_id)
        if live is None or live.deleted or worker not in live.records or not live.m.in_job(worker) \
                or worker not in live.m.last_seen or not self._owner(live.m, worker, caller):
            return None
        live.m.beat(worker, time.monotonic())
        return live.state_bytes.body(job_id, live.m, worker)

    async def heartbeat(self, job: JobRow, worker: Worker, address: str | None, pid: int | None,
                        caller: Caller) -> bytes:
        self.check_worker(job, worker)
        live = await self.live(job)
        m = live.m
        now = time.monotonic()
        minted = new_hash = None
        claim = m.claim(worker, now, self._owner(m, worker, caller))
        if claim == "refuse":
            raise Problem(409, f"worker {list(worker)} is registered by another process that is still "
                          "beating (X-Recycle-Registration differs); a restarted worker is let in once "
                          f"the old one has been silent for {self.settings.heartbeat_timeout_s:g} s",
                          field="worker")
        if claim == "mint":
            minted, new_hash = new_registration()
        if m.started_at is None:  # the job's first worker: its first failure's quick plan gets ready
            self.plans.solver.warm_job(job.id, job.job)
        await self.persist.record(job.id, worker, address, pid, new_hash, live.records)
        if new_hash is not None:
            m.sessions[worker] = new_hash
        m.beat(worker, now)
        body = live.state_bytes.body(job.id, m, worker)
        if minted is not None:
            body = body[:-1] + b',"registration":"' + minted.encode() + b'"}'
        return body

    def _check_reporter(self, m: Membership, caller: Caller, worker: Worker, what: str) -> None:
        """A worker token acts as one registered worker: the one whose registration id it sends."""
        if not caller.admin and (m.sessions.get(worker) is None or not caller.owns(m.sessions[worker])):
            raise Problem(403, f"{what} {list(worker)} is not registered by this process: register with a "
                          "heartbeat and send its registration id as X-Recycle-Registration",
                          field="reporter" if what == "reporter" else "worker")

    def _state(self, live: Live, worker: Worker) -> dict:
        return {**live.m.state(live.job.id), "worker": list(worker), "excluded": worker in live.m.failed}

    async def report_failure(self, job: JobRow, worker: Worker, reporter: Worker | None,
                             reason: str | None, caller: Caller, generation: int | None = None) -> dict:
        self.check_worker(job, worker)
        if reporter is not None:
            self.check_worker(job, reporter, "reporter")
        elif not caller.admin:
            raise Problem(403, "a worker token reports as a worker: give `reporter` (this worker)",
                          field="reporter")
        live = await self.live(job)
        m = live.m
        if reporter is not None:
            self._check_reporter(m, caller, reporter, "reporter")
        if generation is not None and generation < m.generation:
            return self._state(live, worker)  # about an older generation's groups: already replanned
        if m.report(worker, reporter, time.monotonic()):
            by = f" by {list(reporter)}" if reporter else ""
            await self._change(live, {worker}, set(), f"worker {list(worker)} reported failed{by}"
                               + (f": {reason}" if reason else ""))
        return self._state(live, worker)

    async def report_rejoin(self, job: JobRow, worker: Worker, caller: Caller) -> dict:
        self.check_worker(job, worker)
        live = await self.live(job)
        m = live.m
        self._check_reporter(m, caller, worker, "worker")
        if worker not in m.failed:
            raise Problem(409, f"worker {list(worker)} is not in the failure set of generation "
                          f"{m.generation}; nothing to rejoin", field="worker")
        m.beat(worker, time.monotonic())
        await self._change(live, set(), {worker}, f"worker {list(worker)} rejoined")
        return self._state(live, worker)

    async def state(self, job: JobRow) -> dict:
        live = await self.live(job)
        m = live.m
        registered = await self.persist.registrations(job.id)
        now = time.monotonic()
        out = m.state(job.id)
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
        live = await self.live(job)
        deadline = time.monotonic() + wait_s
        self.metrics.long_polls.inc()
        try:
            while not (live.m.generation > after and live.m.settled()):
                event = live.changed
                remaining = deadline - time.monotonic()
                if live.deleted or self.closing or remaining <= 0:
                    return None
                try:
                    await asyncio.wait_for(event.wait(), remaining)
                except TimeoutError:
                    return None
            if live.payload is None or live.payload.generation != live.m.generation:  # loaded settled
                self._settled(live)
            payload = live.payload
            if live.m.streamed(worker) and live.ready is None:
                live.ready = asyncio.ensure_future(self._fill(live, payload))
            ready = live.ready
            if ready is not None and live.m.streamed(worker):
                try:
                    await asyncio.shield(ready)
                except Exception:
                    if live.ready is ready:  # the next poll tries again rather than fail for good
                        live.ready = asyncio.ensure_future(self._fill(live, payload))
                    raise
                if worker not in payload.streams:  # not in the plan's batch: build this one alone
                    plan = await self.plans.get(live.job, payload.plan_id)
                    payload.streams[worker] = await self.plans.stream(live.job, plan, worker)
            if self.turns is not None:  # a slice of the wake-up per loop iteration: beats read between
                await self.turns.take()
            return payload.body(live.m, worker)
        finally:
            self.metrics.long_polls.dec()

    # ---------------------------------------------------------------------------------- watchdog
    async def _watch(self) -> None:
        period = min(0.25, self.settings.heartbeat_timeout_s / 4)
        tick = time.monotonic()
        while True:
            await asyncio.sleep(period)
            await read_waiting_beats(period)
            # A tick far later than planned means the event loop itself was stalled (e.g. thousands
            # of workers registering at once): beats queued meanwhile were not read, so that time is
            # not the workers' silence (without this, a start-up storm failed live workers).
            late, tick = time.monotonic() - tick - period, time.monotonic()
            gc_pauses.tick()
            for live in list(self._members.values()):
                if late > self.settings.heartbeat_interval_s:
                    live.m.excuse(late)
                lost, cause = live.m.watch(time.monotonic())
                if lost:
                    try:
                        await self._change(live, lost, set(), cause)
                    except Exception as exc:  # keep watching the other jobs
                        log.error("watchdog transition failed", exc_info=exc, extra={"job_id": live.job.id})
                self._publish(live)

    def _publish(self, live: Live) -> None:
        """Gauges of the job (from the watchdog and on changes, not per beat: counting the alive
        workers is a pass over all of them)."""
        m = live.m
        self.metrics.generation.labels(live.job.id).set(m.generation)
        self.metrics.alive_workers.labels(live.job.id).set(m.alive_count(time.monotonic()))
        self.metrics.failed_workers.labels(live.job.id).set(len(m.failed))


async def read_waiting_beats(period: float, tries: int = 3) -> None:
    """Let the loop poll the sockets before the watchdog judges silence.

    libuv runs due timers before it polls: after a stall shorter than a heartbeat interval (not
    excused), the watchdog's tick ran before the beats that arrived during the stall were read,
    and a live worker whose beat sat unread in the socket buffer was declared failed. One yield
    is one poll, but the loop can also stall inside that poll (a long callback among the ready
    sockets), after the poll took its list of ready sockets: a beat written meanwhile is still
    unread when the yield returns. So yield again while a yield took longer than a watchdog
    period; a beat that arrived within one period of the judgement is within the watchdog's own
    resolution. At most `tries` yields: a saturated loop must not starve the watchdog
    (tests/api/test_watchdog_stall.py)."""
    for _ in range(tries):
        yielded = time.monotonic()
        await asyncio.sleep(0)
        if time.monotonic() - yielded < period:
            return
