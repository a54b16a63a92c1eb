"""The planner's front door: job + failure set -> validated plan with period, bound and stats.

Steps: normalize the failure set to its canonical class; run the list-scheduling heuristic under a
small grid of policies and keep the best period (measured by the simulator's replay); hand the best
schedule to CP-SAT as a warm start when the model is small enough and time is left; map the winner
back to the concrete workers. The fault-free period comes from the planner's own fault-free plan,
which (all pipelines being identical) is the plan of a single pipeline replicated D times.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from planner.bounds import lower_bound
from planner.candidates import (  # noqa: F401  (re-exported: tests and benchmarks import them here)
    HEURISTIC_GRID_MAX_OPS,
    SWEEP_POLICIES,
    SearchInfo,
    best_heuristic,
    heuristic_policies,
)
from planner.failures import CanonicalFailure, normalize
from planner.fault_free import fault_free_plan, replicate
from planner.simulator import replay
from planner.spec import JobSpec, Worker
from planner.timeline import TIMELINE_FORMAT, Op, SolverStats, SolveStatus
from planner.validate import PlanInvalid, validate

DEFAULT_TIME_LIMIT_S = 10.0
HEURISTIC_SHARE = 0.3
"""Share of a solve's time limit the heuristic grid may use before CP-SAT takes over."""
HEURISTIC_SHARE_WITHOUT_FULL_CP = 0.7
"""The share when CP-SAT cannot build the full model (more than `FULL_CP_MAX_OPS` F/B/W ops, or CP
off): the routing-fixed model improved 8 x 8 x 24 plans by at most 1.2 ms in 27 s
(docs/benchmarks.md, "CP-SAT optimality"), while the full list grid there needs ~4.7 s and finds up to 2% more."""
FULL_CP_MAX_OPS = 3_000
ROUTING_FIXED_SHARE = 0.3
"""Share of CP-SAT's time the routing-fixed model gets before the full model, on jobs small enough
for the full model (larger jobs only ever get the routing-fixed one)."""
"""planner.cp.cpsat.FULL_MAX_OPS (not imported here: the CP module loads only when CP-SAT runs)."""

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


def heuristic_budget_s(job: JobSpec, time_limit_s: float, use_cp: bool) -> float:
    """Wall budget of the heuristic grid within a solve's limit (the rest is CP-SAT's)."""
    full_cp = use_cp and job.op_count <= FULL_CP_MAX_OPS
    return max(1.0, (HEURISTIC_SHARE if full_cp else HEURISTIC_SHARE_WITHOUT_FULL_CP) * time_limit_s)


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
    info = SearchInfo()
    ops, period, policy_name = best_heuristic(
        job, failed, bound.value_ms, budget_s=heuristic_budget_s(job, time_limit_s, use_cp),
        template=template, info=info,
    )
    reached = info.settled and period <= bound.value_ms + 1e-6
    stats = SolverStats(
        status=SolveStatus.OPTIMAL if reached else SolveStatus.HEURISTIC,
        objective_ms=period,
        bound_ms=bound.value_ms,
        heuristic_ms=period,
        wall_s=0.0,
        time_limit_s=time_limit_s,
        heuristic_policy=policy_name,
        replay_settled=info.settled,
        replay_cycle=info.cycle,
    )
    reason = bound.reason
    left = time_limit_s - (time.perf_counter() - started)
    if use_cp and stats.status is not SolveStatus.OPTIMAL and left > 0.5:
        try:
            from planner.cp import cpsat
        except ImportError:  # the CP model is optional at import time only while it is built
            cpsat = None
        if cpsat is not None and job.op_count <= FULL_CP_MAX_OPS and left > 2.0:
            # The routing-fixed model first, briefly: it is far smaller than the full one and
            # polishes the heuristic's routing quickly; the full model then starts from that (measured:
            # uniform 4 x 4 x 8 with [2, 3] failed, the full model alone stays at 385.25 ms for 9 s
            # where the routing-fixed one reaches 385.00 ms in under 2 s; benchmarks/vs_paper_planner.py).
            polish = cpsat.improve(job, failed, ops, period, bound.value_ms, ROUTING_FIXED_SHARE * left,
                                   seed, fixed_routing=True)
            if polish.ops is not None:  # strictly better and valid (checked inside improve())
                polished = replay(job, polish.ops)
                if polished.converged:
                    ops, period = polish.ops, polished.iteration_ms
                    stats.objective_ms = period
                    stats.status = SolveStatus.IMPROVED
                    stats.replay_settled, stats.replay_cycle = True, polished.cycle
            left = time_limit_s - (time.perf_counter() - started)
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
                cp_replay = replay(job, improved.ops)
                cp_period = cp_replay.iteration_ms
                if (cp_replay.converged and cp_period < period - 1e-6
                        and not validate(job, failed, improved.ops)):
                    ops, period = improved.ops, cp_period
                    stats.objective_ms = period
                    stats.status = SolveStatus.IMPROVED
                    stats.replay_settled, stats.replay_cycle = True, cp_replay.cycle
            if stats.replay_settled and period <= stats.bound_ms + 1e-6:
                stats.status = SolveStatus.OPTIMAL
    stats.wall_s = time.perf_counter() - started
    return ops, period, stats, reason


def _to_concrete(canonical: CanonicalFailure, op: Op) -> Op:
    mb = op.microbatch
    return Op(
        canonical.concrete_worker(op.worker),
        op.kind,
        None if mb is None else (canonical.to_concrete[mb[0]], mb[1]),
        op.start_ms,
        op.end_ms,
    )


def _all_to_concrete(canonical: CanonicalFailure, ops: list[Op]) -> list[Op]:
    """`_to_concrete` over a whole plan, with the pipeline map read once (the same ops, faster).

    Equal worker and micro-batch tuples are shared between ops (one per worker, one per
    micro-batch) rather than built per op: ~90 bytes less per op, ~70 MB at 800k ops.
    """
    pipe = canonical.to_concrete
    workers: dict[Worker, Worker] = {}
    mbs: dict[tuple[int, int], tuple[int, int]] = {}
    out = []
    append = out.append
    for op in ops:
        w, mb = op.worker, op.microbatch
        cw = workers.get(w)
        if cw is None:
            cw = workers[w] = (pipe[w[0]], w[1])
        if mb is not None:
            cm = mbs.get(mb)
            if cm is None:
                cm = mbs[mb] = (pipe[mb[0]], mb[1])
            mb = cm
        append(Op(cw, op.kind, mb, op.start_ms, op.end_ms))
    return out


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
    ff = fault_free_plan(job)
    ff_ops = list(ff.ops)
    if not canonical.failed:
        ops = replicate(job, ff_ops)
        period = ff.iteration_ms
        bound = lower_bound(job, ())
        reason = bound.reason
        reached = ff.settled and period <= bound.value_ms + 1e-6
        stats = SolverStats(
            status=SolveStatus.OPTIMAL if reached else SolveStatus.HEURISTIC,
            objective_ms=period, bound_ms=bound.value_ms, heuristic_ms=period, wall_s=0.0,
            time_limit_s=time_limit_s, heuristic_policy=ff.policy, replay_settled=ff.settled,
            replay_cycle=1 if ff.settled else 0,
        )
    else:
        left = max(0.0, time_limit_s - (time.perf_counter() - started))
        ops, period, stats, reason = _solve_canonical(
            job, canonical.failed, left, use_cp, seed, template=ff_ops
        )
        ops = _all_to_concrete(canonical, ops)
    stats.fault_free_method = ff.method
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
        fault_free_iteration_ms=ff.iteration_ms,
        lower_bound_ms=stats.bound_ms,
        bound_reason=reason,
        stats=stats,
    )
