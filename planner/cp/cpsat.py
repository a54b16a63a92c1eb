"""CP-SAT improvement of the heuristic plan, with a proven bound when the model is complete.

`improve` is what `planner.solve` calls after the list scheduler: it warm-starts CP-SAT from the
heuristic schedule, asks for a plan whose steady-state period is at most the heuristic's, and
returns the plan only when its replayed period is strictly better. The model (planner/cp/model.py)
is complete ("full") for small jobs; larger jobs fix the routing from the heuristic ("restricted"),
and their bound says nothing about other routings, so it is reported as 0.0.

Design notes and the validity arguments are in docs/notes/cpsat.md.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from planner.cp.orders import Retimed, relabel, retime, steady_state
from planner.cp.timing import choose_scale
from planner.precedence import collective_ops
from planner.simulator import replay
from planner.spec import JobSpec, Worker
from planner.timeline import Key, Op, orders_of
from planner.validate import validate

FULL_MAX_OPS = 3_000
"""Up to this many F/B/W ops the full model (free routing) is built and its bound is global."""
FULL_MAX_ROUTE_CHOICES = 1_000
"""...and up to this many route choices (`route_choices`). CP-SAT's presolve and then the loading of
the model into its search workers grow with the optional intervals the choices create, and the
loading does not stop at the wall limit: on made-up jobs with 1,200-2,700 choices (6 x 3 x 13 to
6 x 7 x 11, 700-1,400 ops) the two took 4.6-7 s, so 10 s plans ran 12-21 s and CP-SAT never
searched (it returned the hint or nothing); at 500-1,000 choices, 0.3-2.7 s (docs/benchmarks.md,
"CP-SAT's setup and the wall limit")."""
RESTRICTED_MAX_OPS = 15_000
"""Up to this many the routing-fixed model is built; above, building alone would eat the budget."""
NUM_WORKERS = 2
"""CP-SAT search workers: the planning service runs on 2-core machines."""
SymmetryRule = Literal["per_home", "across_homes", "none"]
"""Which interchangeable micro-batches the model orders (`model.add_symmetry_breaking`); defined
here, not in the model, so that `improve` checks it without loading OR-Tools."""
SYMMETRY_RULES: tuple[str, ...] = get_args(SymmetryRule)
EXTRACT_RESERVE_S = 0.1
EXTRACT_RESERVE_PER_OP_S = 2e-5
"""Time kept back from the solver for reading the solution, re-timing, replaying and validating it
(fixed part plus a part per F/B/W op)."""
SOLVER_OVERSHOOT = 0.1
"""Fraction of the solver's share also kept back: on a loaded 2-core box CP-SAT was seen to stop
up to ~0.5 s (of 2 s) after its wall-time limit."""
MIN_SOLVE_S = 0.05
WALL_LIMITED_PARAMETERS: dict[str, Any] = {"subsolvers": ("no_lp",), "use_feasibility_pump": False}
"""CP-SAT's portfolio in a wall-limited solve: the full-problem thread searches without the LP
(`no_lp` instead of `default_lp`) and the feasibility pump is off. Both LP users ignore the wall
limit while they set up: on a made-up 2 x 8 x 15 (720 ops, 420 route choices) `default_lp` spent
6.9 s in its root propagation (83 ms of deterministic time) and the pump 6.2 s, so a full model
given 4.5 s ran 8.0 s and its 10 s plan 14.3 s; with these two, 4.5 s (docs/benchmarks.md, "CP-SAT
past its wall limit"). CP-SAT's interleaved LNS thread, the sub-solves of planner/cp/lns.py and
the deterministic runs (one worker: reproducible plans) keep CP-SAT's defaults."""


def route_choices(job: JobSpec, failed: tuple[Worker, ...] | list) -> int:
    """Route literals of the full model: (micro-batch, stage, alive peer) triples, counted only
    where a stage has two or more alive peers (one candidate needs no literal)."""
    dead = set(failed)
    return job.pipelines * job.microbatches * sum(
        alive for s in range(job.stages)
        if (alive := sum((p, s) not in dead for p in range(job.pipelines))) > 1)


def full_model_fits(job: JobSpec, failed: tuple[Worker, ...] | list) -> bool:
    """Whether `improve` builds the full model (free routing, global bound) for this failure set."""
    return job.op_count <= FULL_MAX_OPS and route_choices(job, failed) <= FULL_MAX_ROUTE_CHOICES


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
    deterministic_time: float = 0.0
    """CP-SAT's deterministic time (comparable across loaded and idle machines)."""
    model_ops: list[Op] | None = None
    """The CP solution's own times converted back to ms (exact scales only; `ops` is re-timed)."""
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
    *,
    symmetry: SymmetryRule = "per_home",
    deterministic_time: float | None = None,
    fixed_routing: bool = False,
) -> CpResult:
    """Search for a plan better than `hint_ops` within `time_limit_s` (model building included).

    `symmetry`: "per_home" (the planner's), "across_homes" (for proofs: far stronger, weaker
    search in a few seconds), "none" (for the tests that check the rules lose no optimum).
    `deterministic_time`: a reproducible run instead (one search worker, CP-SAT's
    `max_deterministic_time`, the wall limit only a safety cap): the same result on any machine
    and load, unless the cap is hit (then `parameters["wall_cap_hit"]` is True).
    `fixed_routing=True`: the routing-fixed model whatever the size (the paper-style baseline of
    evaluation/paper_planner.py keeps its round-robin routing; its bound is then not global).
    """
    if symmetry not in SYMMETRY_RULES:
        raise ValueError(f"symmetry: {symmetry!r} is not one of {', '.join(SYMMETRY_RULES)}")
    started = time.perf_counter()
    deadline = started + time_limit_s
    n_ops = job.op_count
    full = full_model_fits(job, failed) and not fixed_routing  # complete routing: a global bound
    label = "full" if full else "restricted (routing fixed from the heuristic)"
    if n_ops > RESTRICTED_MAX_OPS:
        return _not_run(f"restricted (not built: {n_ops} F/B/W ops > {RESTRICTED_MAX_OPS})", started)

    from planner.cp.model import Instance, ModelTooLarge, add_hint, build, cp_model, full_routes

    scale = choose_scale(job)
    warm = _warm_start(job, failed, hint_ops, hint_period_ms, full, symmetry == "across_homes")
    inst = Instance(job, tuple(failed), scale, full_routes(job, failed) if full else _routes_of(warm.ops))
    try:
        # The cap admits the hint: where the replay settles into a cycle of unequal iterations,
        # the least single-iteration span of its orders is above the replayed period.
        period_cap = max(scale.up(hint_period_ms), scale.up(warm.max_span) + 1)
        model = build(inst, period_cap, scale.up(bound_ms), symmetry=symmetry)
    except ModelTooLarge as exc:
        return _not_run(f"restricted (not built: {exc})", started)
    add_hint(model, warm)

    left = deadline - time.perf_counter() - EXTRACT_RESERVE_S - EXTRACT_RESERVE_PER_OP_S * n_ops
    left *= 1 - SOLVER_OVERSHOOT
    if deterministic_time is None and left < MIN_SOLVE_S:
        return _not_run(f"{label}; no time left to solve", started)
    solver = cp_model.CpSolver()
    if deterministic_time is None:
        params = {"num_workers": NUM_WORKERS, "random_seed": seed, "max_time_in_seconds": round(left, 3),
                  "log_search_progress": False}
        params.update(WALL_LIMITED_PARAMETERS)
    else:
        params = {"num_workers": 1, "random_seed": seed, "max_deterministic_time": deterministic_time,
                  "max_time_in_seconds": time_limit_s, "log_search_progress": False}
    if symmetry == "across_homes":
        # Presolve's dual reductions otherwise drop the hint under this rule: 4 of 25 made-up
        # cases ended UNKNOWN in 7 s with a valid complete hint (docs/notes/cpsat.md).
        params["keep_all_feasible_solutions_in_presolve"] = True
    for name, value in params.items():
        if isinstance(value, tuple):
            getattr(solver.parameters, name).extend(value)
        else:
            setattr(solver.parameters, name, value)
    status = solver.Solve(model.cp)
    result = CpResult(
        ops=None, cp_status=solver.StatusName(status), model=label, bound_ms=0.0, wall_s=0.0,
        workers=NUM_WORKERS, branches=solver.NumBranches(), conflicts=solver.NumConflicts(),
        scale=scale.scale, deterministic_time=solver.ResponseProto().deterministic_time,
        parameters={**params, "time_units_per_ms": scale.scale, "exact_times": scale.exact},
    )
    if deterministic_time is not None:
        result.workers = 1
        result.parameters["wall_cap_hit"] = solver.WallTime() >= time_limit_s * 0.99
    result.parameters["memory_exact"] = inst.memory_exact
    if full and inst.memory_exact and status in (cp_model.OPTIMAL, cp_model.FEASIBLE, cp_model.UNKNOWN):
        result.bound_ms = max(bound_ms, global_bound_ms(solver.BestObjectiveBound(), scale.scale, job.stages))
    if status in (cp_model.OPTIMAL, cp_model.FEASIBLE):
        result.objective_ms = scale.ms(solver.ObjectiveValue())
        placed = _placed(model, solver)
        if scale.exact:
            result.model_ops = _model_ops(model, placed, solver)
        orders = {w: [key for _, key in seq] for w, seq in placed.items()}
        for w in model.inst.alive_workers:  # one that serves nothing still all-reduces (rule 5)
            orders.setdefault(w, [])
        ops = retime(job, orders).ops
        period = replay(job, ops).iteration_ms
        if period < hint_period_ms - 1e-6 and not validate(job, failed, ops):
            result.ops, result.period_ms = ops, period
    result.wall_s = time.perf_counter() - started
    return result


def global_bound_ms(model_bound: float, scale: int, stages: int) -> float:
    """The real problem's bound from the model's proven bound LB (in units).

    For fixed orders and routing the least feasible period is a cycle ratio W/k of integer weights
    with k <= S wrap edges (one per stage window), and ceil(real optimum x scale) >= LB, so the real
    optimum x scale > LB - 1 and is a fraction with denominator <= S: it is >= LB - 1 + 1/S.
    """
    return max(0.0, (math.floor(model_bound + 1e-9) - 1 + 1 / stages) / scale)


def _warm_start(job, failed, hint_ops, hint_period_ms, full: bool, across_homes: bool) -> Retimed:
    """The hint relabelled into the symmetry-broken form, timed at its steady state."""
    from planner.cp.model import full_routes, symmetry_class

    # Relabel after retiming: the steady state can reorder two stage-0 forwards of one class.
    warm = steady_state(job, orders_of(hint_ops), hint_period_ms)
    routes = full_routes(job, failed) if full else _routes_of(warm.ops)
    warm.ops = relabel(warm.ops, lambda p, m: symmetry_class(routes, p, m, job.stages, across_homes))
    return warm


Placed = dict[Worker, list[tuple[int, Key]]]


def _placed(model, solver) -> Placed:
    """Each worker's compute ops with their start (units), in start order. F/B/W last >= 1 unit,
    so two ops of one worker never share a start and the order is exactly the solution's."""
    placed: Placed = {}
    for (p, m, s), task in model.tasks.items():
        q = next(q for q, lit in task.choice.items() if lit is None or solver.BooleanValue(lit))
        for kind, var in task.start.items():
            placed.setdefault((q, s), []).append((solver.Value(var), (kind, p, m, s)))
    return {w: sorted(seq) for w, seq in placed.items()}


def _model_ops(model, placed: Placed, solver) -> list[Op]:
    """The solution's own times in ms (exact durations); valid as is when the scale is exact."""
    job, scale = model.inst.job, model.inst.scale
    costs = job.costs
    ops = [Op(w, k, (p, m), scale.ms(t), scale.ms(t) + costs.duration(k, s))
           for w, seq in placed.items() for t, (k, p, m, s) in seq]
    for w in model.inst.alive_workers:
        s = w[1]
        ops += collective_ops(costs, s, [w], scale.ms(solver.Value(model.allreduce[s])))
    return ops
