"""A coordinator's first plan for a failure set nobody precomputed: a few of the planner's heuristic
candidates, no search grid and no CP-SAT, so workers get a valid assignment in well under a second
at 8 x 64 (the full solve, heuristic grid then CP-SAT, takes up to its 10 s time limit; the grid
alone took 3.7 s there). The full solve runs afterwards and replaces this plan when it is clearly
better (`api.coordination`).

Runs inside a solve process (`api.solve_worker`), never on the event loop. The candidates are the
ones `planner.candidates.best_heuristic` tries first - the fault-free plan with the failed workers'
micro-batches inserted on their peers, then the damaged pipelines dissolved into the others, then
the ReCycle paper's construction - each replayed by the simulator and validated against the
contract; the first valid one with a settled replay wins, else the best valid one.
"""

from __future__ import annotations

import time
from typing import Any

QUICK_STATUS_POLICY_PREFIX = "quick:"
"""`heuristic_policy` of a quick plan starts with this: readers can tell it from a full solve."""


def quick_class(job, canonical_failed: tuple) -> tuple[dict[str, Any], dict[str, Any]]:
    """Plan one canonical failure class quickly: (summary, timeline document). Raises what the
    planner raises (`SpecError` for a failure set that cannot be planned) or `ValueError` when no
    candidate gives a valid plan (then the caller waits for the full solve)."""
    from planner.bounds import lower_bound
    from planner.failures import normalize
    from planner.fault_free import fault_free_plan, replicate
    from planner.paper_style import paper_style_schedule
    from planner.routing import balanced_routing, dissolving_routing
    from planner.simulator import ReplayError, replay
    from planner.solve import PlanResult, concrete_ops
    from planner.sweep import SweepPolicy, insertion_orders, sweep_schedule
    from planner.timeline import SolverStats, SolveStatus
    from planner.validate import validate

    started = time.perf_counter()
    canonical = normalize(job, canonical_failed)
    failed = canonical.failed
    ff = fault_free_plan(job)
    bound = lower_bound(job, failed)

    def candidates():
        if not failed:
            yield replicate(job, list(ff.ops)), "fault-free"
            return
        routing = balanced_routing(job, failed, 0)
        yield (sweep_schedule(job, routing, SweepPolicy(), insertion_orders(job, routing, list(ff.ops))),
               "insert-into-fault-free(overrun=0,rot=0)")
        dissolved = dissolving_routing(job, failed)
        if dissolved is not None:
            yield sweep_schedule(job, dissolved, SweepPolicy()), "dissolve+sweep"
        yield paper_style_schedule(job, failed), "paper-style(1F1B,round-robin)"

    best: tuple[list, float, str, Any] | None = None
    for ops, name in candidates():
        if ops is None:
            continue
        try:
            report = replay(job, ops)
        except ReplayError:
            continue
        if validate(job, failed, ops):
            continue
        if best is None or report.iteration_ms < best[1] - 1e-9:
            best = (ops, report.iteration_ms, name, report)
        if report.converged:
            break  # good enough for a first plan: the full solve looks for the best one
    if best is None:
        raise ValueError(f"no quick candidate gives a valid plan for failure class {canonical.key}")
    ops, period, name, report = best
    optimal = report.converged and period <= bound.value_ms + 1e-6
    stats = SolverStats(
        status=SolveStatus.OPTIMAL if optimal else SolveStatus.HEURISTIC, objective_ms=period,
        bound_ms=bound.value_ms, heuristic_ms=period, wall_s=time.perf_counter() - started,
        time_limit_s=0.0, heuristic_policy=QUICK_STATUS_POLICY_PREFIX + name,
        replay_settled=report.converged, replay_cycle=report.cycle if report.converged else 0,
        fault_free_method=ff.method)
    result = PlanResult(job=job, failed=tuple(sorted(canonical.concrete_worker(w) for w in failed)),
                        canonical=canonical, ops=concrete_ops(canonical, ops), iteration_ms=period,
                        fault_free_iteration_ms=ff.iteration_ms,
                        lower_bound_ms=bound.value_ms, bound_reason=bound.reason, stats=stats)
    timeline = result.timeline_json()
    return timeline["solver"], timeline
