"""The planner's front door: job + failure set -> validated plan with period, bound and stats.

Steps: normalize the failure set to its canonical class; run the list-scheduling heuristic under a
small grid of policies and keep the best period (measured by the simulator's replay); hand the best
schedule to CP-SAT as a warm start when the model is small enough and time is left; map the winner
back to the concrete workers. The fault-free period comes from the planner's own fault-free plan,
which (all pipelines being identical) is the plan of a single pipeline replicated D times.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from planner.bounds import lower_bound
from planner.dropping import dropped_job, relabel_dropped
from planner.failures import CanonicalFailure, normalize
from planner.heuristic import Policy, list_schedule
from planner.routing import Routing, balanced_routing, dissolving_routing
from planner.simulator import ReplayError, replay
from planner.spec import JobSpec, Worker
from planner.sweep import SweepPolicy, insertion_orders, orders_of, sweep_schedule
from planner.timeline import TIMELINE_FORMAT, Op, SolverStats, SolveStatus
from planner.validate import PlanInvalid, validate

DEFAULT_TIME_LIMIT_S = 10.0
HEURISTIC_GRID_MAX_OPS = 60_000
"""Above this many F/B/W ops only the default policy runs (the 3 s bar at 32 x 16 x 64)."""
HEURISTIC_SHARE = 0.3
"""Share of a solve's time limit the heuristic grid may use before CP-SAT takes over."""
SWEEP_POLICIES = [
    SweepPolicy(warmup_slack=slack, w_overrun=overrun) for slack in (0, 1, -1) for overrun in (0.0, 0.5)
]


@dataclass
class PlanResult:
    """A plan for concrete workers, ready to export."""

    job: JobSpec
    failed: tuple[Worker, ...]
    canonical: CanonicalFailure
    ops: list[Op]
    iteration_ms: float
    fault_free_iteration_ms: float
    lower_bound_ms: float
    bound_reason: str
    stats: SolverStats
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def gap(self) -> float:
        return self.iteration_ms / self.lower_bound_ms - 1.0

    def timeline_json(self) -> dict[str, Any]:
        """The `recycle.timeline/v1` document (contract), plus a `solver` field."""
        ops = sorted(self.ops, key=lambda o: (o.worker, o.start_ms))
        return {
            "format": TIMELINE_FORMAT,
            "job": self.job.filled(),
            "failed": [list(w) for w in self.failed],
            "iteration_ms": round(self.iteration_ms, 6),
            "fault_free_iteration_ms": round(self.fault_free_iteration_ms, 6),
            "lower_bound_ms": round(self.lower_bound_ms, 6),
            "ops": [op.to_json() for op in ops],
            "solver": self.summary_json(),
        }

    def summary_json(self) -> dict[str, Any]:
        return {
            "failure_class": self.canonical.key,
            "iteration_ms": round(self.iteration_ms, 6),
            "fault_free_iteration_ms": round(self.fault_free_iteration_ms, 6),
            "lower_bound_ms": round(self.lower_bound_ms, 6),
            "lower_bound_reason": self.bound_reason,
            "gap": round(self.gap, 6),
            "slowdown_vs_fault_free": round(self.iteration_ms / self.fault_free_iteration_ms, 6),
            **self.stats.to_json(),
        }


def heuristic_policies(job: JobSpec) -> list[Policy]:
    """The list-scheduling grid, most often winning first (measured on random 1-4 failure sets of
    the shared scenarios), so a time budget cuts the least useful variants."""
    if job.op_count > HEURISTIC_GRID_MAX_OPS:
        return [Policy(feed_bottleneck=True)]
    grid = []
    for feed in (True, False):
        for slack in (0, 1, None):
            if feed and slack is None:
                continue  # feeding only lifts the forward-ahead cap, which memory-only lacks
            for tolerance in (0.5, None, 0.0):
                for rot in (0, 1):
                    grid.append(Policy(w_tolerance=tolerance, ahead_slack=slack, routing_rotation=rot,
                                       feed_bottleneck=feed))
    return grid


def best_heuristic(
    job: JobSpec,
    failed: tuple[Worker, ...],
    bound_ms: float = 0.0,
    budget_s: float = float("inf"),
    template: list[Op] | None = None,
) -> tuple[list[Op], float, str]:
    """The best constructive schedule by replayed period: Zero-Bubble-style 1F1B sweeps, list
    schedules over the policy grid, and the best list schedule with its W's re-placed by a sweep.
    Stops early once a schedule reaches the proven bound `bound_ms` (nothing can beat it), and
    skips the remaining list policies once `budget_s` is spent (at least four always run)."""
    started = time.perf_counter()
    best: tuple[list[Op], float, str] | None = None

    def consider(ops: list[Op] | None, name: str) -> bool:
        """Keep the schedule if it is the best so far; True once the bound is reached."""
        nonlocal best
        if ops is not None:
            try:
                period = replay(job, ops).iteration_ms
            except ReplayError:
                period = None
            if period is not None and (best is None or period < best[1] - 1e-9):
                best = (ops, period, name)
        return best is not None and best[1] <= bound_ms + 1e-6

    big = job.op_count > HEURISTIC_GRID_MAX_OPS
    routings: dict[int, Routing] = {}

    def routing(rot: int) -> Routing:
        return routings.setdefault(rot, balanced_routing(job, failed, rot))

    if template is not None and failed:
        # Minimal disruption first: the fault-free plan everywhere, re-routed work inserted on peers.
        for rot in (0, 1) if not big else (0,):
            orders = insertion_orders(job, routing(rot), template)
            for overrun in (0.0, 0.5) if not big else (0.0,):
                policy = SweepPolicy(w_overrun=overrun, routing_rotation=rot)
                if consider(sweep_schedule(job, routing(rot), policy, orders),
                            f"insert-into-fault-free(overrun={overrun:g},rot={rot})"):
                    return best
    if not big:
        for policy in SWEEP_POLICIES:
            if consider(sweep_schedule(job, routing(0), policy), policy.name):
                return best
    dissolved = dissolving_routing(job, failed) if failed else None
    if dissolved is not None:
        # Dissolving the damaged pipelines into the others is always a candidate, so a plan is
        # never slower than dropping them (with the same scheduler).
        for policy in SWEEP_POLICIES[:1] if big else SWEEP_POLICIES:
            if consider(sweep_schedule(job, dissolved, policy), f"dissolve+{policy.name}"):
                return best
        dropped = dropped_job(job, failed) if not big else None
        if dropped is not None:
            dropped_ops = best_heuristic(dropped, (), 0.0, budget_s / 4)[0]
            if consider(relabel_dropped(job, failed, dropped, dropped_ops), "drop-damaged-pipelines"):
                return best
    best_list: tuple[Policy, list[Op]] | None = None  # the best list schedule so far
    for tried, policy in enumerate(heuristic_policies(job)):
        if (tried >= 4 or best is not None) and time.perf_counter() - started > budget_s:
            break
        ops = list_schedule(job, routing(policy.routing_rotation), policy)
        done = consider(ops, policy.name)
        if best is not None and best[2] == policy.name:
            best_list = (policy, ops)
        if done:
            return best
    if not big and best_list is not None:
        policy, ops = best_list
        orders = orders_of(job, ops)
        for overrun in (0.0, 0.5, 1.0):
            sweep = SweepPolicy(w_overrun=overrun, routing_rotation=policy.routing_rotation)
            name = f"{policy.name}+resweep(overrun={overrun:g})"
            if consider(sweep_schedule(job, routing(policy.routing_rotation), sweep, orders), name):
                break
    assert best is not None
    return best


def _solve_canonical(
    job: JobSpec,
    failed: tuple[Worker, ...],
    time_limit_s: float,
    use_cp: bool,
    seed: int,
    template: list[Op] | None = None,
) -> tuple[list[Op], float, SolverStats, str]:
    started = time.perf_counter()
    bound = lower_bound(job, failed)
    ops, period, policy_name = best_heuristic(
        job, failed, bound.value_ms, budget_s=max(1.0, HEURISTIC_SHARE * time_limit_s), template=template
    )
    stats = SolverStats(
        status=SolveStatus.OPTIMAL if period <= bound.value_ms + 1e-6 else SolveStatus.HEURISTIC,
        objective_ms=period,
        bound_ms=bound.value_ms,
        heuristic_ms=period,
        wall_s=0.0,
        time_limit_s=time_limit_s,
        heuristic_policy=policy_name,
    )
    reason = bound.reason
    left = time_limit_s - (time.perf_counter() - started)
    if use_cp and stats.status is not SolveStatus.OPTIMAL and left > 0.5:
        try:
            from planner import cpsat
        except ImportError:  # the CP model is optional at import time only while it is built
            cpsat = None
        if cpsat is not None:
            improved = cpsat.improve(job, failed, ops, period, bound.value_ms, left, seed)
            stats.cp_status = improved.cp_status
            stats.cp_model = improved.model
            stats.cp_wall_s = improved.wall_s
            stats.cp_workers = improved.workers
            stats.cp_seed = seed
            stats.cp_branches = improved.branches
            stats.cp_conflicts = improved.conflicts
            if improved.bound_ms > stats.bound_ms + 1e-6:
                stats.bound_ms = improved.bound_ms
                reason = "CP-SAT proof on the full model"
            if improved.ops is not None:
                cp_period = replay(job, improved.ops).iteration_ms
                if cp_period < period - 1e-6 and not validate(job, failed, improved.ops):
                    ops, period = improved.ops, cp_period
                    stats.objective_ms = period
                    stats.status = SolveStatus.IMPROVED
            if period <= stats.bound_ms + 1e-6:
                stats.status = SolveStatus.OPTIMAL
    stats.wall_s = time.perf_counter() - started
    return ops, period, stats, reason


@lru_cache(maxsize=64)
def _fault_free_cached(job_json: str, time_limit_s: float, use_cp: bool, seed: int):
    job = JobSpec.model_validate_json(job_json)
    single = job.model_copy(update={"pipelines": 1})
    ops, period, stats, reason = _solve_canonical(single, (), time_limit_s, use_cp, seed)
    return ops, period, stats, reason


def _replicate(job: JobSpec, single_ops: list[Op]) -> list[Op]:
    return [
        Op((p, op.worker[1]), op.kind, None if op.microbatch is None else (p, op.microbatch[1]),
           op.start_ms, op.end_ms)
        for p in range(job.pipelines)
        for op in single_ops
    ]


def _to_concrete(canonical: CanonicalFailure, op: Op) -> Op:
    mb = op.microbatch
    return Op(
        canonical.concrete_worker(op.worker),
        op.kind,
        None if mb is None else (canonical.to_concrete[mb[0]], mb[1]),
        op.start_ms,
        op.end_ms,
    )


def plan(
    job: JobSpec,
    failed: tuple[Worker, ...] | list = (),
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    use_cp: bool = True,
    seed: int = 0,
    check: bool = True,
) -> PlanResult:
    """Plan one iteration for `job` with the workers in `failed` dead.

    Raises `SpecError` for a failure set that cannot be planned (e.g. a stage with no survivor).
    The result is validated against the contract's six rules unless `check` is False.
    """
    started = time.perf_counter()
    canonical = normalize(job, failed)
    ff_ops, ff_period, ff_stats, ff_reason = _fault_free_cached(
        job.model_dump_json(), time_limit_s / 2 if canonical.failed else time_limit_s, use_cp, seed
    )
    if not canonical.failed:
        ops = _replicate(job, ff_ops)
        period, stats, reason = ff_period, dataclasses.replace(ff_stats), ff_reason
        bound = lower_bound(job, ())
        if bound.value_ms > stats.bound_ms:  # never report less than the analytic bound of D pipelines
            stats.bound_ms, reason = bound.value_ms, bound.reason
    else:
        left = max(0.0, time_limit_s - (time.perf_counter() - started))
        ops, period, stats, reason = _solve_canonical(
            job, canonical.failed, left, use_cp, seed, template=ff_ops
        )
        ops = [_to_concrete(canonical, op) for op in ops]
    concrete_failed = tuple(sorted(canonical.concrete_worker(w) for w in canonical.failed))
    if check:
        violations = validate(job, concrete_failed, ops)
        if violations:
            raise PlanInvalid(violations)
    stats.wall_s = time.perf_counter() - started
    return PlanResult(
        job=job,
        failed=concrete_failed,
        canonical=canonical,
        ops=ops,
        iteration_ms=period,
        fault_free_iteration_ms=ff_period,
        lower_bound_ms=stats.bound_ms,
        bound_reason=reason,
        stats=stats,
    )
