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
from planner.compress import (
    ExpandedOps,
    Expansion,
    can_compress,
    check_plannable,
    dropping_expansion,
    receivers_for,
    replicated_expansion,
    reroute_expansion,
    should_compress,
    with_pipelines,
)
from planner.cp.cpsat import full_model_fits
from planner.dropping import dropped_job
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
"""The share when CP-SAT cannot build the full model (`planner.cp.cpsat.full_model_fits`), or CP
off: the routing-fixed model improved 8 x 8 x 24 plans by at most 1.2 ms in 27 s
(docs/benchmarks.md, "CP-SAT optimality"), while the full list grid there needs ~4.7 s and finds up
to 2% more."""
HEURISTIC_SHARE_LARGE = 0.85
"""The share, without the full model, on jobs of more than `LNS_USEFUL_MAX_OPS` F/B/W ops. There
the LNS's 140-160-op windows cover little of the plan in a few seconds and the routing search
(`planner.route_search`, the heuristic's last step) is what still finds better plans: on 30 fresh
failure sets of the two 8 x 8 x 24 scenarios at 10 s (2026-11-26) the LNS improved two plans, by
0.1 and 0.2 ms, while the routing search's swaps decided the worst one (gpt-1.5b with (3, 5) and
(7, 2) dead: 1501.7 ms after 55 swaps, 1494.7 after ~100). Side by side on those 30 sets, 0.85
against 0.7: at 10 s every plan equal; at 6 s (a box ~1.7x slower) two better (gpt-1.5b [2, 3]
1442.8 -> 1439.6, 2p-wmem [5, 1] 1329.4 -> 1321.0), none worse, longest solve 5.8 s. 15% leaves the
LNS at least 1.5 s of a 10 s limit (`_solve_canonical` skips it below 1 s)."""
LNS_USEFUL_MAX_OPS = 4_000
"""Up to this many F/B/W ops the LNS gets HEURISTIC_SHARE_WITHOUT_FULL_CP's 30%: on made-up jobs of
1,000-3,024 ops it improved the heuristic's 10 s plans by 1.1-1.8 ms (6 x 7 x 24, 6 x 8 x 8, 8 x 7 x 8,
8 x 3 x 13)."""
ROUTING_FIXED_SHARE = 0.3
"""Share of CP-SAT's time the routing-fixed model gets before the full model, on jobs small enough
for the full model (larger jobs only ever get the routing-fixed one)."""
LNS_SHARE_RESTRICTED = 1.0
"""Share of CP-SAT's time the large-neighbourhood search (planner/cp/lns.py) gets on jobs too large
for the full model (3,000-15,000 F/B/W ops, or too many route choices): all of it, instead of the
routing-fixed model, which gained at most 1.2 ms in 27 s there (docs/benchmarks.md, "CP-SAT
optimality") and whose build alone (0.45 s on 8 x 8 x 24) pushed the solve past its limit when it
ran after the LNS with what was left (side by side, 2026-11-23: max wall 11.7 s against 10.6 s)."""
LNS_SHARE = 0.0
"""The same on jobs small enough for the full model: none. Side by side at the 10 s default
(2026-11-23), giving the LNS 60% of the time after the routing-fixed polish made 6 of the 10
4 x 4 x 8 failure plans worse (e.g. [1,0],[3,3]: 392.5 -> 398.0 ms) and none better: the full
model does more with that time (docs/benchmarks.md)."""

BOUND_ROUNDING = 1e-9
"""Relative excess of a bound over its plan's period that `PlanResult` treats as float rounding."""


@dataclass
class PlanResult:
    """A plan for concrete workers, ready to export."""

    job: JobSpec
    failed: tuple[Worker, ...]
    canonical: CanonicalFailure
    ops: list[Op]
    """Every op of the plan; an `ExpandedOps` (built on first use) when `expansion` is set."""
    iteration_ms: float
    fault_free_iteration_ms: float
    lower_bound_ms: float
    bound_reason: str
    stats: SolverStats
    extra: dict[str, Any] = field(default_factory=dict)
    expansion: Expansion | None = None
    """The compressed plan and its expansion map (planner/compress.py), for jobs planned compressed."""

    def __post_init__(self) -> None:
        # The bound and the period are sums of the same durations taken in different orders, so a
        # plan that reaches its bound can come out below it by a few units in the last place (32
        # of 144 fuzzed plans, 1e-15 to 1e-12 ms). Such a bound is reported as the period itself,
        # so `lower_bound_ms <= iteration_ms` holds exactly for whoever checks it; a larger excess
        # would be an unsound bound and is left for the falsification tests to catch.
        excess = self.lower_bound_ms - self.iteration_ms
        if 0 < excess <= BOUND_ROUNDING * max(1.0, self.iteration_ms):
            self.lower_bound_ms = self.iteration_ms
            self.stats.bound_ms = min(self.stats.bound_ms, self.iteration_ms)

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
            **({"compressed_candidates": {k: round(v, 6) for k, v in candidates.items()}}
               if (candidates := self.extra.get("compressed_candidates")) else {}),
        }


def heuristic_budget_s(job: JobSpec, time_limit_s: float, use_cp: bool,
                       failed: tuple[Worker, ...] = ()) -> float:
    """Wall budget of the heuristic grid within a solve's limit (the rest is CP-SAT's)."""
    if use_cp and full_model_fits(job, failed):
        share = HEURISTIC_SHARE
    elif use_cp and job.op_count > LNS_USEFUL_MAX_OPS:
        share = HEURISTIC_SHARE_LARGE
    else:
        share = HEURISTIC_SHARE_WITHOUT_FULL_CP
    return max(1.0, share * time_limit_s)


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
    budget_s = heuristic_budget_s(job, time_limit_s, use_cp, failed)
    ops, period, policy_name = best_heuristic(
        job, failed, bound.value_ms, budget_s=budget_s, template=template, info=info,
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
        heuristic_budget_s=budget_s,
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
        full = full_model_fits(job, failed)
        if cpsat is not None and full and left > 2.0:
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
        share = LNS_SHARE if full else LNS_SHARE_RESTRICTED
        if cpsat is not None and job.op_count <= cpsat.RESTRICTED_MAX_OPS and share > 0 and left > 1.0:
            ops, period = _lns_step(job, failed, ops, period, bound.value_ms, share * left, seed, stats)
            left = time_limit_s - (time.perf_counter() - started)
        if cpsat is not None and (share < 1.0 or stats.lns is None):  # else the LNS had it all
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
        if stats.replay_settled and period <= stats.bound_ms + 1e-6:  # CP-SAT's or the LNS's plan
            stats.status = SolveStatus.OPTIMAL
    stats.wall_s = time.perf_counter() - started
    return ops, period, stats, reason


def _lns_step(job: JobSpec, failed: tuple[Worker, ...], ops: list[Op], period: float, bound_ms: float,
              time_limit_s: float, seed: int, stats: SolverStats) -> tuple[list[Op], float]:
    """The large-neighbourhood search from the current plan; its plan replaces the current one when
    strictly better and valid (re-timed orders: valid by construction, checked anyway)."""
    imported = time.perf_counter()
    from planner.cp.lns import improve_lns  # OR-Tools' first import: 0.4 s, inside the limit

    time_limit_s -= time.perf_counter() - imported
    result = improve_lns(job, failed, ops, period, bound_ms, time_limit_s, seed)
    stats.lns = {"neighbourhoods": result.neighbourhoods, "accepted": result.accepted,
                 "improved": result.improved, "wall_s": round(result.wall_s, 4),
                 "sub_status": result.sub_status, "parameters": result.parameters}
    if result.ops is not None and not validate(job, failed, result.ops):
        stats.objective_ms = result.period_ms
        stats.status = SolveStatus.IMPROVED
        stats.replay_settled, stats.replay_cycle = True, result.cycle
        return result.ops, result.period_ms
    return ops, period


def _to_concrete(canonical: CanonicalFailure, op: Op) -> Op:
    mb = op.microbatch
    return Op(
        canonical.concrete_worker(op.worker),
        op.kind,
        None if mb is None else (canonical.to_concrete[mb[0]], mb[1]),
        op.start_ms,
        op.end_ms,
    )


def concrete_ops(canonical: CanonicalFailure, ops: list[Op]) -> list[Op]:
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


def _solve_compressed(
    job: JobSpec,
    canonical: CanonicalFailure,
    time_limit_s: float,
    use_cp: bool,
    seed: int,
    template: list[Op],
    receivers: int | None = None,
) -> tuple[Expansion, float, SolverStats, str, dict[str, float]]:
    """Plan the compressed job (planner/compress.py): the damaged pipelines plus `receivers`
    undamaged ones are planned as a job of their own, one representative runs the template for all
    the other undamaged pipelines, and the compressed dropped-pipelines plan is kept when faster.
    The dropped plan is made first (one pipeline's fault-free plan): when it reaches the full job's
    proven bound nothing can beat it and the re-routing part is not planned at all.
    Period: the compressed plan's replay (equal to the expanded plan's); bound: the full job's
    (the planned part's own bound or CP-SAT proof is for a smaller job and is not used)."""
    started = time.perf_counter()
    failed = canonical.failed
    bound = lower_bound(job, failed)
    candidates: dict[str, float] = {}
    best: tuple[Expansion, float, bool, int, str] | None = None
    dropped = dropped_job(job, failed)
    if dropped is not None:
        drop_plan = fault_free_plan(dropped)
        candidates["dropped_ms"] = drop_plan.iteration_ms
        if drop_plan.settled:
            # Never behind dropping the damaged pipelines (planner/dropping.py), compressed the same way.
            expansion = dropping_expansion(job, failed, canonical.to_concrete, drop_plan.ops)
            expansion.job, expansion.ops = fault_free_single(dropped), drop_plan.ops
            best = (expansion, drop_plan.iteration_ms, True, 1, "drop-damaged-pipelines")
    stats = SolverStats(status=SolveStatus.HEURISTIC, objective_ms=0.0, bound_ms=bound.value_ms,
                        heuristic_ms=0.0, wall_s=0.0, time_limit_s=time_limit_s)
    if best is None or best[1] > bound.value_ms + 1e-6:
        damaged = len({p for p, _ in failed})
        receivers = min(receivers or receivers_for(job, damaged), job.pipelines - damaged - 1)
        left = max(0.0, time_limit_s - (time.perf_counter() - started))
        planned, _, stats, _ = _solve_canonical(with_pipelines(job, damaged + receivers), failed,
                                                 left, use_cp, seed, template=template)
        expansion = reroute_expansion(job, failed, canonical.to_concrete, planned, template, receivers)
        report = replay(expansion.job, list(expansion.ops))
        candidates["rerouted_ms"] = report.iteration_ms
        if best is None or report.iteration_ms < best[1] - 1e-9:
            best = (expansion, report.iteration_ms, report.converged, report.cycle, stats.heuristic_policy)
    assert best is not None
    expansion, period, settled, cycle, policy = best
    stats.bound_ms = bound.value_ms
    stats.objective_ms = period
    if stats.status is not SolveStatus.IMPROVED or policy == "drop-damaged-pipelines":
        stats.status, stats.heuristic_ms = SolveStatus.HEURISTIC, period
    if settled and period <= bound.value_ms + 1e-6:
        stats.status = SolveStatus.OPTIMAL
    stats.heuristic_policy = f"{expansion.name}+{policy}"
    stats.replay_settled, stats.replay_cycle = settled, cycle
    stats.time_limit_s = time_limit_s
    return expansion, period, stats, bound.reason, candidates


def fault_free_single(job: JobSpec) -> JobSpec:
    from planner.fault_free import single_pipeline

    return single_pipeline(job)


def plan(
    job: JobSpec,
    failed: tuple[Worker, ...] | list = (),
    time_limit_s: float = DEFAULT_TIME_LIMIT_S,
    use_cp: bool = True,
    seed: int = 0,
    check: bool = True,
    compress: bool | None = None,
    receivers: int | None = None,
) -> PlanResult:
    """Plan one iteration for `job` with the workers in `failed` dead.

    `time_limit_s` bounds the failure solve; a job's first plan in a process (without a disk
    cache) also makes the job's deterministic fault-free plan before it (`planner.fault_free`), so
    that call's wall is the fault-free plan's time plus about the limit.
    Raises `SpecError` for a failure set that cannot be planned (e.g. a stage with no survivor).
    The result is validated against the contract's six rules unless `check` is False (a compressed
    plan: its compressed job, planner/compress.py). `compress` None compresses above
    `COMPRESS_MIN_OPS` only; True/False force it (tests, measurements); `receivers` overrides how
    many undamaged pipelines the compressed job plans beside the damaged ones.
    """
    started = time.perf_counter()
    canonical = normalize(job, failed)
    damaged = len({p for p, _ in canonical.failed})
    wanted = should_compress(job, damaged) if compress is None else compress
    compressed = wanted and can_compress(job, damaged)
    check_plannable(job, canonical.failed, compressed)
    ff = fault_free_plan(job)
    # The limit is the failure solve's: the job's fault-free plan is made once per job (no clock,
    # cached in the process and on disk when RECYCLE_FAULT_FREE_CACHE is set), and when its making
    # counted here the first failure set planned for a job got what was left, so the same set
    # planned twice got two different plans (made-up 6 x 4 x 21: a 6.0 s fault-free plan left the
    # first set 4 s; 5 x 4 x 20: 13.8 s left it the heuristic's 1 s minimum and no CP-SAT).
    solve_started = time.perf_counter()
    ff_ops = list(ff.ops)
    expansion: Expansion | None = None
    extra: dict[str, Any] = {}
    if not canonical.failed:
        if compressed:
            expansion = replicated_expansion(ff_ops, job.pipelines)
            expansion.job, expansion.ops = fault_free_single(job), tuple(ff_ops)
            ops: Any = ExpandedOps(expansion)
        else:
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
    elif compressed:
        left = max(0.0, time_limit_s - (time.perf_counter() - solve_started))
        expansion, period, stats, reason, extra["compressed_candidates"] = _solve_compressed(
            job, canonical, left, use_cp, seed, ff_ops, receivers)
        ops = ExpandedOps(expansion)
    else:
        left = max(0.0, time_limit_s - (time.perf_counter() - solve_started))
        ops, period, stats, reason = _solve_canonical(
            job, canonical.failed, left, use_cp, seed, template=ff_ops
        )
        ops = concrete_ops(canonical, ops)
    stats.fault_free_method = ff.method
    concrete_failed = tuple(sorted(canonical.concrete_worker(w) for w in canonical.failed))
    if check:
        if expansion is not None:  # the compressed plan: valid exactly when its expansion is
            violations = validate(expansion.job, expansion.failed, list(expansion.ops))
        else:
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
        extra=extra,
        expansion=expansion,
    )
