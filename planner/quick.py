"""A first plan in well under a second: the full search's first candidates only.

A coordinator whose failure set nobody precomputed hands this out at once, and the full solve
(`planner.solve.plan`: heuristic grid, then CP-SAT, up to its time limit) replaces it when it is
clearly better. The candidates are ones `planner.candidates.best_heuristic` tries as well, so the
full solve is never worse than the quick plan: the fault-free plan with the failed workers'
micro-batches inserted on their peers, the damaged pipelines dissolved into the others, and the
ReCycle paper's construction. Each is replayed by the simulator and validated against the contract;
the first valid one whose replay settles wins (a first plan, not the best one), else the best valid.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

from planner.bounds import lower_bound
from planner.failures import normalize
from planner.fault_free import fault_free_plan, replicate
from planner.paper_style import paper_style_schedule
from planner.routing import balanced_routing, dissolving_routing
from planner.simulator import ReplayError, replay
from planner.solve import PlanResult, concrete_ops
from planner.spec import JobSpec, Worker
from planner.sweep import SweepPolicy, insertion_orders, sweep_schedule
from planner.timeline import Op, SolverStats, SolveStatus
from planner.validate import validate

QUICK_POLICY_PREFIX = "quick:"
"""`heuristic_policy` of a quick plan starts with this, so readers can tell it from a full solve."""


def quick_candidates(job: JobSpec, failed: tuple[Worker, ...], template: list[Op]
                     ) -> Iterator[tuple[list[Op] | None, str]]:
    """(schedule or None, name) in the order tried; names are the full search's own."""
    if not failed:
        yield replicate(job, template), "fault-free"
        return
    routing = balanced_routing(job, failed, 0)
    yield (sweep_schedule(job, routing, SweepPolicy(), insertion_orders(job, routing, template)),
           "insert-into-fault-free(overrun=0,rot=0)")
    dissolved = dissolving_routing(job, failed)
    if dissolved is not None:
        yield sweep_schedule(job, dissolved, SweepPolicy()), f"dissolve+{SweepPolicy().name}"
    yield paper_style_schedule(job, failed), "paper-style(1F1B,round-robin)"


def quick_plan(job: JobSpec, failed: tuple[Worker, ...] | list = ()) -> PlanResult:
    """A valid plan for `job` with `failed` dead, from the quick candidates. Raises `SpecError` for
    a failure set that cannot be planned, `ValueError` when no quick candidate is valid (the caller
    then waits for the full solve)."""
    started = time.perf_counter()
    canonical = normalize(job, failed)
    ff = fault_free_plan(job)
    bound = lower_bound(job, canonical.failed)
    best: tuple[list[Op], float, str, object] | None = None
    for ops, name in quick_candidates(job, canonical.failed, list(ff.ops)):
        if ops is None:
            continue
        try:
            report = replay(job, ops)
        except ReplayError:
            continue
        if validate(job, canonical.failed, ops):
            continue
        if best is None or report.iteration_ms < best[1] - 1e-9:
            best = (ops, report.iteration_ms, name, report)
        if report.converged:
            break
    if best is None:
        raise ValueError(f"no quick candidate gives a valid plan for failure class {canonical.key}")
    ops, period, name, report = best
    optimal = report.converged and period <= bound.value_ms + 1e-6
    stats = SolverStats(
        status=SolveStatus.OPTIMAL if optimal else SolveStatus.HEURISTIC, objective_ms=period,
        bound_ms=bound.value_ms, heuristic_ms=period, wall_s=time.perf_counter() - started,
        time_limit_s=0.0, heuristic_policy=QUICK_POLICY_PREFIX + name,
        replay_settled=report.converged, replay_cycle=report.cycle if report.converged else 0,
        fault_free_method=ff.method)
    return PlanResult(job=job, failed=tuple(sorted(canonical.concrete_worker(w) for w in canonical.failed)),
                      canonical=canonical, ops=concrete_ops(canonical, ops), iteration_ms=period,
                      fault_free_iteration_ms=ff.iteration_ms, lower_bound_ms=bound.value_ms,
                      bound_reason=bound.reason, stats=stats)
