"""The coordinator's state machine for one job: membership, generations, failure / rejoin / watchdog
decisions and what each worker is told. Pure Python: no database, no I/O, no event loop; every
method takes the time it should act at, so it is tested with hand-worked cases (tests/api/
test_membership.py). `api.coordination` drives it (locks, plan solves, long-polls) and
`api.membership_store` persists it.

Generations: the job starts at generation 1 with no failures. Every change of the failure set (a
failure report that stands, a rejoin, the watchdog) is generation G+1, whose status is `solving`
until its plan exists (`plan_ready`), then `running`; `waiting` when a stage has lost every worker
(a rejoin to that stage brings the job back); `stopped` when no plan exists.

A failure set nobody precomputed first gets a quick plan (a few heuristic candidates); when the full
solve of the same set later proves better by `ADOPT_MARGIN`, it becomes generation G+1 with the same
failure set (`improve`), which workers take up at their next iteration boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.spec import Worker


@dataclass(frozen=True, slots=True)
class Timeouts:
    """The coordinator's clock settings (seconds), as `api.settings.Settings` gives them."""

    heartbeat_interval_s: float = 1.0
    heartbeat_timeout_s: float = 5.0
    register_timeout_s: float = 60.0

    @classmethod
    def of(cls, settings) -> Timeouts:
        return cls(settings.heartbeat_interval_s, settings.heartbeat_timeout_s, settings.register_timeout_s)

    @property
    def confirm_s(self) -> float:
        """Long enough for a live worker's next beat even on a loaded machine, well under the
        heartbeat timeout that would catch a silent worker anyway."""
        return max(2 * self.heartbeat_interval_s, self.heartbeat_timeout_s / 2)

    @property
    def too_slow_s(self) -> float:
        """A reported peer that keeps beating is excluded this long after the report (a dead peer is
        found by the heartbeat timeout first, and its generation clears the reports)."""
        return 3 * self.heartbeat_timeout_s + self.confirm_s


ADOPT_MARGIN = 0.005
"""How much shorter (relative) the full solve's period must be than the quick plan's to replace it.
A switch is not free: every worker stops at its iteration boundary, builds the new generation's gloo
groups and re-reads its instruction stream (recovery measured ~0.26 s on loopback); and a gain of a
fraction of a percent is below what the executor's measured iteration times resolve (they vary by a
few percent run to run), so it might not be a gain at all. Half a percent of a 1.5 s period (8 x 64)
is 7.5 ms per iteration, repaying a 0.3 s switch within ~40 iterations; the quick plan measured
0.13% behind the full solve at 4 x 4 (kept) and 0.9% at 8 x 64 (replaced)."""


def worth_adopting(current_ms: float | None, candidate_ms: float | None) -> bool:
    """Whether a plan of period `candidate_ms` should replace a running one of `current_ms`."""
    if current_ms is None or candidate_ms is None:
        return False
    return candidate_ms < current_ms * (1.0 - ADOPT_MARGIN)


class FailureSet(tuple):
    """A generation's failed workers: a sorted tuple (stored, compared and answered as one) whose
    `in` is a set lookup. Every beat, answer and watchdog tick asks `worker in failed` (the
    watchdog for every worker): on a plain tuple that was O(failures) each, and once a stall got
    hundreds of workers declared failed at 4,096 daemons, those scans took 40 % of the server
    (py-spy) - slowing it further, so the next watchdog tick failed more."""

    _members: frozenset

    def __new__(cls, workers=()) -> FailureSet:
        self = super().__new__(cls, sorted({(p, s) for p, s in workers}))
        self._members = frozenset(self)
        return self

    def __contains__(self, worker) -> bool:
        return worker in self._members


def lost_stages(pipelines: int, stages: int, failed: tuple[Worker, ...]) -> list[int]:
    """Stages whose every worker is in the failure set."""
    dead = set(failed)
    return [s for s in range(stages) if all((p, s) in dead for p in range(pipelines))]


@dataclass
class Membership:
    pipelines: int
    stages: int
    timeouts: Timeouts = field(default_factory=Timeouts)
    generation: int = 1
    failed: FailureSet = field(default_factory=FailureSet)
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
    changed_at: float = 0.0
    """When this generation began (or was loaded)."""

    # ------------------------------------------------------------------------------- queries
    def in_job(self, worker: Worker) -> bool:
        p, s = worker
        return 0 <= p < self.pipelines and 0 <= s < self.stages

    def settled(self) -> bool:
        """Whether long-polls may be answered: the generation's plan is decided."""
        return self.status != "solving"

    def idle(self) -> bool:
        """Nothing to watch: not solving and no live registered worker (may be evicted from memory)."""
        return self.status != "solving" and all(w in self.failed for w in self.last_seen)

    def fresh(self, worker: Worker, now: float, within_s: float) -> bool:
        seen = self.last_seen.get(worker)
        return seen is not None and now - seen <= within_s

    def alive_count(self, now: float) -> int:
        timeout = self.timeouts.heartbeat_timeout_s
        return sum(1 for w, seen in self.last_seen.items() if w not in self.failed and now - seen <= timeout)

    # ---------------------------------------------------------------------------- transitions
    def beat(self, worker: Worker, now: float) -> None:
        self.last_seen[worker] = now
        if self.started_at is None:
            self.started_at = now

    def claim(self, worker: Worker, now: float, owner: bool) -> str:
        """Who may beat as `worker`: `keep` (the admin, or the process that registered it), `mint` (a
        new registration binds it to this process: first beat, or the old process is failed or has
        been silent for the heartbeat timeout) or `refuse` (another process still beats for it)."""
        if owner:
            return "keep"
        if self.sessions.get(worker) is not None and worker not in self.failed \
                and self.fresh(worker, now, self.timeouts.heartbeat_timeout_s):
            return "refuse"
        return "mint"

    def excuse(self, stalled_s: float) -> None:
        """The service itself stalled for `stalled_s` (its watchdog ran that late): beats could not
        be read meanwhile, so nobody's silence during the stall counts against them."""
        for w in self.last_seen:
            self.last_seen[w] += stalled_s

    def set_failed(self, failed: tuple[Worker, ...] | set[Worker], cause: str | None, now: float,
                   bump: bool) -> bool:
        """Set the failure set (a new generation when `bump`). Returns whether a plan is needed
        (status `solving`); otherwise the status is `waiting`: a stage has no alive worker."""
        if bump:
            self.generation += 1
            self.suspects.clear()  # reports were about the old generation's groups
            self.changed_at = now
        self.failed = FailureSet(failed)
        self.reason, self.iteration_ms = cause, None
        lost = lost_stages(self.pipelines, self.stages, self.failed)
        if lost:
            # Not the end of the job: a worker that rejoins such a stage brings it back, and every
            # worker then restores the newest checkpoint (the executor's daemon does the restore).
            self.status, self.plan_id = "waiting", None
            self.reason = (f"{cause}; stage {', '.join(map(str, lost))} has no alive worker: waiting for "
                           "a worker to rejoin it, then every worker restores the newest checkpoint")
            return False
        self.status, self.plan_id = "solving", None
        return True

    def change(self, failed: set[Worker], cause: str, now: float) -> bool | None:
        """A new generation with failure set `failed`; None when it is the current one (no change),
        else whether a plan is needed."""
        if set(failed) == set(self.failed):
            return None
        return self.set_failed(failed, cause, now, bump=True)

    def plan_ready(self, plan_id: str | None, status: str, summary: dict | None, error: str | None) -> None:
        """The plan of this generation's failure set: `done` runs it, anything else stops the job."""
        self.plan_id = plan_id
        if status == "done" and summary is not None:
            self.status, self.iteration_ms = "running", summary.get("objective_ms")
        elif status == "pending":
            self.status = "solving"
        else:
            self.status = "stopped"
            self.reason = f"no plan for failure set {[list(w) for w in self.failed]}: {error or status}"

    def improve(self, generation: int, plan_id: str, summary: dict, now: float) -> bool:
        """A better plan for generation `generation`'s failure set arrived (the full solve after a
        quick first plan). Compare-and-swap: only if that generation is still the current one and
        running (a failure, rejoin or restart since makes it moot), and only when `worth_adopting`.
        Then it is generation G+1, same failure set, running the new plan. Returns whether adopted."""
        if generation != self.generation or self.status != "running" or plan_id == self.plan_id:
            return False
        new_ms = summary.get("objective_ms")
        if not worth_adopting(self.iteration_ms, new_ms):
            return False
        old_ms = self.iteration_ms
        self.generation += 1
        self.suspects.clear()  # reports were about the old generation's groups
        self.changed_at = now
        self.plan_id, self.iteration_ms = plan_id, new_ms
        base = (self.reason or "").split("; plan improved")[0]
        self.reason = (f"{base}; " if base else "") + (
            f"plan improved for the same failure set: {old_ms:g} -> {new_ms:g} ms per iteration")
        return True

    def no_plan(self, why: str) -> None:
        """The planner refuses this failure set outright (e.g. the job spec cannot hold it)."""
        self.status, self.plan_id, self.reason = "stopped", None, why

    def report(self, worker: Worker, reporter: Worker | None, now: float) -> bool:
        """A failure report about `worker`. Returns whether it stands now (the caller then moves to
        a new generation); False: already failed, or a suspicion for the watchdog to confirm.

        A gloo group breaks for every member when one dies, so a survivor can blame a live peer. A
        peer's report about a worker whose beats are fresh therefore only stands once that worker
        misses its next beats, or no new generation came long after (too slow; `watch`). A report
        from outside the job (operator, launcher) or by a worker about itself is final."""
        if worker in self.failed:
            return False
        fresh = self.fresh(worker, now, 1.5 * self.timeouts.heartbeat_interval_s)
        if reporter is not None and reporter != worker and fresh:
            at = self.suspects.get(worker)
            if at is None or at - self.changed_at < self.timeouts.confirm_s:
                self.suspects[worker] = now  # a repeated report, now well into the generation, counts
            return False
        return True

    def watch(self, now: float) -> tuple[set[Worker], str]:
        """Workers to declare failed now, and why: silent past the heartbeat timeout; reported by a
        peer and silent since; reported and, though beating, no new generation long after (too slow
        for its peers); or never registered while its peers did."""
        t = self.timeouts
        silent = {w for w, seen in self.last_seen.items()
                  if now - seen > t.heartbeat_timeout_s and w not in self.failed}
        confirm, too_slow_s = t.confirm_s, t.too_slow_s
        quiet = {w for w, at in self.suspects.items()
                 if now - at > confirm and self.last_seen.get(w, 0) <= at}
        # Only reports made well into the generation: one just after a change is about the old groups.
        slow = {w for w, at in self.suspects.items()
                if now - at > too_slow_s and at - self.changed_at >= confirm} - quiet
        for w in [w for w in self.suspects if w in self.failed or w in quiet | slow]:
            del self.suspects[w]
        never: set[Worker] = set()
        if self.started_at is not None and not self.all_registered \
                and now - self.started_at > t.register_timeout_s:
            never = {(p, s) for p in range(self.pipelines) for s in range(self.stages)
                     if (p, s) not in self.last_seen and (p, s) not in self.failed}
            self.all_registered = not never
        parts = []
        for workers, why in ((silent, f"missed heartbeats for {t.heartbeat_timeout_s:g} s"),
                             (quiet - silent, f"reported by a peer and silent for {confirm:g} s since"),
                             (slow - silent, "reported by a peer and, though beating, no new generation "
                                             f"{too_slow_s:g} s later (too slow for its peers; it may "
                                             "rejoin)"),
                             (never, f"never registered within {t.register_timeout_s:g} s of the first")):
            if workers:
                parts.append(f"{why}: {', '.join(str(list(w)) for w in sorted(workers))}")
        return silent | quiet | slow | never, "; ".join(parts)

    # ---------------------------------------------------------------------------- what to say
    def state(self, job_id: str) -> dict:
        """The membership state every worker of this generation is told (MembershipState)."""
        return {
            "job_id": job_id,
            "generation": self.generation,
            "status": self.status,
            "reason": self.reason,
            "failed": [list(w) for w in self.failed],
            "plan_id": self.plan_id,
            "iteration_ms": self.iteration_ms,
            "heartbeat_interval_s": self.timeouts.heartbeat_interval_s,
            "heartbeat_timeout_s": self.timeouts.heartbeat_timeout_s,
        }

    def assignment_head(self, job_id: str, excluded: bool = False) -> dict:
        """This settled generation's assignment, less `worker` and its instruction stream (shared
        by every alive worker); `excluded`: the one every failed worker gets.

        The alive set is not listed: it is every worker of the `pipelines` x `stages` grid not in
        `failed`, and the worker derives it (`executor.membership.alive_workers`). Listed, it was
        ~33 KB per answer at 64 x 64, x 4,095 answers after every failure - five times the bytes
        of the streams themselves; the failure set grows with the failures, not with the job."""
        head = {**self.state(job_id), "pipelines": self.pipelines, "stages": self.stages}
        if excluded:  # the same for every failed worker (its `worker` field says which)
            head["status"] = "excluded"
            head["reason"] = (f"this worker is in the failure set of generation {self.generation}; "
                              "report a rejoin (POST .../rejoins) to come back")
        return head

    def streamed(self, worker: Worker) -> bool:
        """Whether the worker's assignment carries an instruction stream: it runs this plan."""
        return self.status == "running" and self.plan_id is not None and worker not in self.failed
