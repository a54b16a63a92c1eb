"""Large-neighbourhood search with CP-SAT: improve a valid plan one small sub-model at a time.

The whole-job model is too large for CP-SAT to make progress on 8 x 8 x 24 (a 60 s routing-fixed
run moved the 1493.5 ms plan of failure [0, 2] by 2.2 ms), and the full model with free routing
is not even built there. LNS builds one model (`lns_routes`: the incumbent's routing plus every
alive peer for re-routed work) and then repeatedly, on a copy of it:
- picks a neighbourhood (`neighbourhood`): the tasks whose forward starts in a time window,
  across all stages or a band of stages;
- fixes everything else: the executor of every task outside, and on every worker the relative
  order of the ops outside (`fix_outside`); the ops inside may move anywhere and change executor;
- hints the incumbent (feasible in the sub-model: it satisfies every added constraint), caps the
  period at the incumbent's, and solves with a short limit.
A solution is read back as per-worker orders, re-timed in exact ms, replayed and validated, and
replaces the incumbent when its period is no worse (ties let the search walk plateaus). The
neighbourhood size adapts: grown after a sub-model is solved to optimality, shrunk after a timeout.

Deterministic given the seed and the number of sub-solves (each runs one CP-SAT worker under a
deterministic-time limit); how many sub-solves fit in the wall limit depends on the machine.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from typing import Any

from planner.cp.orders import Retimed, retime, steady_state
from planner.cp.timing import choose_scale
from planner.simulator import ReplayError, replay
from planner.spec import JobSpec, Worker
from planner.timeline import COMPUTE_KINDS, Op, Orders, orders_of
from planner.validate import validate

TaskKey = tuple[int, int, int]

SUB_DETERMINISTIC_TIME = 0.2
"""CP-SAT deterministic-time limit of one sub-model (about 0.3-1 s of wall time here)."""
START_FRACTION = 0.08
"""Share of all tasks in the first neighbourhood; adapted between MIN_ and MAX_FRACTION."""
MIN_FRACTION, MAX_FRACTION = 0.02, 0.5
GROW, SHRINK = 1.25, 0.8
LOG = False
RESERVE_S = 0.3
"""Wall time kept for reading back, re-timing and validating the last sub-solve."""


@dataclass
class LnsResult:
    ops: list[Op] | None
    """A valid plan strictly better than the start, or None."""
    period_ms: float
    """Replayed period of the best plan seen (the start's when nothing better was found)."""
    neighbourhoods: int = 0
    improving: int = 0
    """Sub-solves whose plan was strictly better than the incumbent at the time."""
    statuses: dict[str, int] = field(default_factory=dict)
    """CP-SAT status name -> how many sub-solves ended so."""
    wall_s: float = 0.0
    build_s: float = 0.0
    curve: list[tuple[float, float]] = field(default_factory=list)
    """(seconds since the call, incumbent period ms) at the start and after every improvement."""
    parameters: dict[str, Any] = field(default_factory=dict)


def lns_routes(job: JobSpec, failed: tuple[Worker, ...], ops: list[Op],
               every_peer: bool) -> dict[TaskKey, tuple[int, ...]]:
    """Candidate executors: every alive peer for every task (`every_peer`: small jobs, where that
    model stays small), else every alive peer only for a task whose home worker is dead (the
    routing decisions that matter most) and the incumbent's executor plus the home worker for the rest."""
    dead = set(failed)
    peers = [tuple(q for q in range(job.pipelines) if (q, s) not in dead) for s in range(job.stages)]
    executor = {(o.microbatch[0], o.microbatch[1], o.worker[1]): o.worker[0] for o in ops if o.kind == "F"}
    routes = {}
    for (p, m, s), q in executor.items():
        routes[(p, m, s)] = peers[s] if every_peer or (p, s) in dead else tuple(sorted({p, q}))
    return routes


def neighbourhood(rng: random.Random, hint: Retimed, stages: int, size: int) -> set[TaskKey]:
    """About `size` tasks whose forward starts in one time window of the hint, either across all
    stages or within a band of three adjacent stages (where a bottleneck's neighbours are)."""
    starts = sorted((o.start_ms, (o.microbatch[0], o.microbatch[1], o.worker[1]))
                    for o in hint.ops if o.kind == "F")
    if rng.random() < 0.5 or stages <= 3:
        chosen = starts
    else:
        low = rng.randrange(stages - 2)
        chosen = [(t, key) for t, key in starts if low <= key[2] < low + 3]
    size = max(1, min(size, len(chosen)))
    first = rng.randrange(len(chosen) - size + 1)
    return {key for _, key in chosen[first:first + size]}


def fix_outside(sub, model, free: set[TaskKey], orders: Orders, executor: dict[TaskKey, int]) -> None:
    """On the copy `sub` of `model.cp`: the executor of every task outside `free`, and on every
    worker the incumbent's order of the ops outside `free` (ops inside may go anywhere)."""
    var = sub.get_int_var_from_proto_index
    for key, task in model.tasks.items():
        if key in free:
            continue
        for q, lit in task.choice.items():
            if lit is not None:
                sub.Add(var(lit.Index()) == int(q == executor[key]))
    duration = model.inst.duration
    for seq in orders.values():
        kept = [(k, model.tasks[(p, m, s)]) for k, p, m, s in seq if (p, m, s) not in free]
        for (kind_u, u), (kind_v, v) in zip(kept, kept[1:], strict=False):
            sub.Add(var(v.start[kind_v].Index()) >= var(u.start[kind_u].Index()) + duration[kind_u][u.key[2]])


def _orders_from(model, solver) -> Orders:
    """Each worker's compute ops in the solution's start order (ops last >= 1 unit: no ties)."""
    placed: dict[Worker, list] = {}
    for (p, m, s), task in model.tasks.items():
        q = next(q for q, lit in task.choice.items() if lit is None or solver.BooleanValue(lit))
        for kind in COMPUTE_KINDS:
            placed.setdefault((q, s), []).append((solver.Value(task.start[kind]), (kind, p, m, s)))
    return {w: [key for _, key in sorted(seq)] for w, seq in placed.items()}


def improve_lns(job: JobSpec, failed: tuple[Worker, ...], start_ops: list[Op], start_period_ms: float,
                bound_ms: float, time_limit_s: float, seed: int, every_peer: bool = False) -> LnsResult:
    """The best plan LNS reaches from `start_ops` within `time_limit_s` (model building included)."""
    from planner.cp.model import Instance, add_hint, build, cp_model

    started = time.perf_counter()
    deadline = started + time_limit_s
    result = LnsResult(None, start_period_ms, curve=[(0.0, start_period_ms)])
    scale = choose_scale(job)
    inst = Instance(job, tuple(failed), scale, lns_routes(job, failed, start_ops, every_peer))
    model = build(inst, scale.up(start_period_ms), scale.up(bound_ms), sort_pipelines=False,
                  symmetry_breaking=False)
    result.build_s = time.perf_counter() - started
    rng = random.Random(seed)
    fraction = START_FRACTION
    best_ops, best = start_ops, start_period_ms
    incumbent_ops, incumbent = start_ops, start_period_ms
    params = {"num_workers": 1, "random_seed": seed, "max_deterministic_time": SUB_DETERMINISTIC_TIME, "log_search_progress": LOG,
              "linearization_level": 0, "cp_model_presolve": False}
    result.parameters = {**params, "time_units_per_ms": scale.scale, "routes": "every alive peer" if every_peer else "incumbent+home; dead home: every alive peer",
                         "start_fraction": START_FRACTION}
    while best > bound_ms + 1e-6:
        left = deadline - time.perf_counter() - RESERVE_S
        if left < 0.1:
            break
        orders = orders_of(incumbent_ops)
        hint = steady_state(job, orders, incumbent)
        executor = {(o.microbatch[0], o.microbatch[1], o.worker[1]): o.worker[0]
                    for o in incumbent_ops if o.kind == "F"}
        free = neighbourhood(rng, hint, job.stages, round(fraction * len(model.tasks)))
        model.cp.ClearHints()
        add_hint(model, hint)
        sub = model.cp.clone()
        sub.Add(sub.get_int_var_from_proto_index(model.period.Index()) <= scale.up(incumbent))
        fix_outside(sub, model, free, orders, executor)
        solver = cp_model.CpSolver()
        for name, value in {**params, "max_time_in_seconds": round(left, 3)}.items():
            setattr(solver.parameters, name, value)
        status = solver.Solve(sub)
        name = solver.StatusName(status)
        result.neighbourhoods += 1
        result.statuses[name] = result.statuses.get(name, 0) + 1
        fraction = min(MAX_FRACTION, fraction * GROW) if status == cp_model.OPTIMAL else \
            max(MIN_FRACTION, fraction * SHRINK)
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            continue
        try:
            ops = retime(job, _orders_from(model, solver)).ops
            replayed = replay(job, ops)
        except (ReplayError, ValueError):
            continue
        period = replayed.iteration_ms
        if not replayed.converged or period > incumbent + 1e-9 or validate(job, failed, ops):
            continue
        incumbent_ops, incumbent = ops, period
        if period < best - 1e-6:
            best_ops, best = ops, period
            result.improving += 1
            result.curve.append((round(time.perf_counter() - started, 3), period))
    if best < start_period_ms - 1e-6:
        result.ops, result.period_ms = best_ops, best
    result.wall_s = time.perf_counter() - started
    return result
