"""CP-SAT improvement of the heuristic plan, with a proven bound when the model is complete.

`improve` is what `planner.solve` calls after the list scheduler: it warm-starts CP-SAT from the
heuristic schedule, asks for a plan whose steady-state period is at most the heuristic's, and
returns the plan only when its replayed period is strictly better. The model (planner/cp/model.py)
is complete ("full") for small jobs; larger jobs fix the routing from the heuristic ("restricted"),
and their bound says nothing about other routings, so it is reported as 0.0.

Design notes and the validity arguments are in docs/notes/cpsat.md.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from planner.cp.orders import Orders, orders_of, relabel, retime, steady_state
from planner.cp.timing import choose_scale
from planner.simulator import replay, validate
from planner.spec import JobSpec, Worker
from planner.timeline import Op

FULL_MAX_OPS = 3_000
"""Up to this many F/B/W ops the full model (free routing) is built and its bound is global."""
RESTRICTED_MAX_OPS = 15_000
"""Up to this many the routing-fixed model is built; above, building alone would eat the budget."""
NUM_WORKERS = 2
"""CP-SAT search workers: the planning service runs on 2-core machines."""
EXTRACT_RESERVE_S = 0.1
"""Time kept back from the solver for reading the solution, re-timing and re-validating it."""
MIN_SOLVE_S = 0.05


@dataclass
class CpResult:
    ops: list[Op] | None
    """A valid schedule strictly better than the hint, or None."""
    cp_status: str
    """CP-SAT's status name (OPTIMAL, FEASIBLE, INFEASIBLE, MODEL_INVALID, UNKNOWN)."""
    model: str
    """'full', or 'restricted (<what was fixed>)'."""
    bound_ms: float
    """Proven global lower bound on the period (full model only; 0.0 otherwise)."""
    wall_s: float
    workers: int
    branches: int
    conflicts: int
    objective_ms: float | None = None
    """The model's period for its best solution (in rounded model units, converted back)."""
    period_ms: float | None = None
    """Replayed period of `ops` (exact ms)."""
    scale: int = 0
    """Model time units per ms."""
    parameters: dict[str, Any] = field(default_factory=dict)


def _not_run(model: str, started: float, reason_status: str = "UNKNOWN") -> CpResult:
    return CpResult(None, reason_status, model, 0.0, time.perf_counter() - started, 0, 0, 0)


def _routes_of(ops: list[Op]) -> dict[tuple[int, int, int], tuple[int, ...]]:
    return {(o.microbatch[0], o.microbatch[1], o.worker[1]): (o.worker[0],) for o in ops if o.kind == "F"}


def improve(
    job: JobSpec,
    failed: tuple[Worker, ...],
    hint_ops: list[Op],
    hint_period_ms: float,
    bound_ms: float,
    time_limit_s: float,
    seed: int,
) -> CpResult:
    """Search for a plan better than `hint_ops` within `time_limit_s` (model building included)."""
    started = time.perf_counter()
    deadline = started + time_limit_s
    n_ops = job.op_count
    full = n_ops <= FULL_MAX_OPS
    label = "full" if full else "restricted (routing fixed from the heuristic)"
    if n_ops > RESTRICTED_MAX_OPS:
        return _not_run(f"restricted (not built: {n_ops} F/B/W ops > {RESTRICTED_MAX_OPS})", started)

    from planner.cp.model import Instance, ModelTooLarge, add_hint, build, cp_model, full_routes

    scale = choose_scale(job)
    routes0 = _routes_of(hint_ops)
    if full:
        hint = relabel(job, failed, hint_ops, sort_pipelines=True, same_class=lambda p, m: p)
    else:
        stages = range(job.stages)
        hint = relabel(job, failed, hint_ops, sort_pipelines=False,
                       same_class=lambda p, m: tuple(routes0[(p, m, s)] for s in stages))
    warm = steady_state(job, orders_of(hint), hint_period_ms)
    inst = Instance(job, tuple(failed), scale, full_routes(job, failed) if full else _routes_of(warm.ops))
    try:
        model = build(inst, scale.up(hint_period_ms), scale.up(bound_ms), sort_pipelines=full)
    except ModelTooLarge as exc:
        return _not_run(f"restricted (not built: {exc})", started)
    add_hint(model, warm)

    left = deadline - time.perf_counter() - EXTRACT_RESERVE_S
    if left < MIN_SOLVE_S:
        return _not_run(f"{label}; no time left to solve", started)
    solver = cp_model.CpSolver()
    params = {"num_workers": NUM_WORKERS, "random_seed": seed, "max_time_in_seconds": round(left, 3),
              "log_search_progress": False}
    for name, value in params.items():
        setattr(solver.parameters, name, value)
    status = solver.Solve(model.cp)
    status_name = solver.StatusName(status)
    result = CpResult(
        ops=None, cp_status=status_name, model=label, bound_ms=0.0, wall_s=0.0, workers=NUM_WORKERS,
        branches=solver.NumBranches(), conflicts=solver.NumConflicts(), scale=scale.scale,
        parameters={**params, "time_units_per_ms": scale.scale, "exact_times": scale.exact},
    )
    if full and status in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
        # ceil(real optimum x scale) >= the model's bound, so the real optimum > bound - 1 unit.
        result.bound_ms = max(bound_ms, scale.ms(solver.BestObjectiveBound() - 1))
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        result.objective_ms = scale.ms(solver.ObjectiveValue())
        ops = retime(job, _solution_orders(model, solver)).ops
        period = replay(job, ops).iteration_ms
        if period < hint_period_ms - 1e-6 and not validate(job, failed, ops):
            result.ops, result.period_ms = ops, period
    result.wall_s = time.perf_counter() - started
    return result


def _solution_orders(model, solver) -> Orders:
    """Each worker's compute ops sorted by their start in the solution (F/B/W last >= 1 unit, so
    two ops of one worker never share a start and the order is exactly the solution's)."""
    placed: dict[Worker, list[tuple[int, tuple[str, int, int, int]]]] = {}
    for (p, m, s), task in model.tasks.items():
        q = next(q for q, lit in task.choice.items() if lit is None or solver.BooleanValue(lit))
        for kind, var in task.start.items():
            placed.setdefault((q, s), []).append((solver.Value(var), (kind, p, m, s)))
    return {w: [key for _, key in sorted(seq)] for w, seq in placed.items()}
