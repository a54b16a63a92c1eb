"""Large-neighbourhood search: small CP-SAT sub-models built from scratch, routing fixed.

The plan is held as per-worker op orders and its steady-state one-iteration schedule
(`orders.steady_state`: every worker's span at most the period). A *neighbourhood* frees a set of
compute ops (a window of the plan by start time over all workers, a window on a band of 2-3
stages, or the iteration's tail). The sub-model times every op, but only the free ops may change
places: outside the neighbourhood each worker keeps its order as a chain of difference
constraints (no intervals, no literals); a worker's free ops (a contiguous run of its order) sit
between its fixed neighbours under one NoOverlap; rule 6 is posted in order terms on the workers
whose order may change; the period is the largest span, as in the full model. So the whole plan
can shift around the window and the period itself moves. Fixing the ops outside the window at
their *times* instead (the first version) gave smaller models but could not move the period: the
fixed ops after the window pin the iteration's end. The removed LNS of commit 2d2015a cloned the
whole model (intervals and routing literals for every op) and spent 1-3 s of presolve per
neighbourhood; these models have no routing literals and run with presolve off.

Each sub-model is solved for a fraction of a second with the current plan as a complete, feasible
hint. The solution's per-worker orders are re-timed in exact milliseconds (`orders.retime`) and
replayed; the new plan replaces the current one when its period is not worse (ties move the search
on), and the result is returned only when strictly better than the input.
"""

from __future__ import annotations

import random
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from ortools.sat.python import cp_model

from planner.cp.cpsat import SOLVER_OVERSHOOT
from planner.cp.model import Instance
from planner.cp.orders import OrderCycle, Retimed, retime, steady_state
from planner.cp.timing import TimeScale, choose_scale
from planner.precedence import needs
from planner.simulator import ReplayError, replay
from planner.spec import JobSpec, Worker
from planner.timeline import Key, Op, Orders, SolveStatus, orders_of

SUB_TIME_S = 0.5
SUB_TIME_PER_OP_S = 1e-4
"""Wall limit of one sub-solve: SUB_TIME_S plus this per F/B/W op of the job (every op is a
variable; 4 x 4 x 8: 0.54 s, 8 x 8 x 24: 0.96 s), a fraction of the 10 s default solve."""
FREE_OPS = (140, 160)
"""Free compute ops per neighbourhood, tried in turn. Measured on 4 x 4 x 8 with four failures
(384 ops, 7 s): 40-120 reached 410.75 ms (seed 0), 140: 402.5-404.25 (seeds 1-2), 160:
402.75-410.75 (seeds 0-2), 200: 409.5-412.75 (seeds 1-2); smaller ones solve to optimality but
rarely move the period."""
KINDS = ("window", "stages", "tail")
"""The neighbourhood portfolio, cycled in this order."""


@dataclass
class Base:
    """The current plan: its orders, steady-state schedule in model units, and lookups."""

    orders: Orders
    period_ms: float
    start: dict[Key, int]
    worker: dict[Key, Worker]
    allreduce: dict[int, int]
    span: int


@dataclass
class LnsResult:
    ops: list[Op] | None
    """A valid plan strictly better than the input, or None."""
    period_ms: float
    status: SolveStatus
    """IMPROVED when `ops` is set, else HEURISTIC (the LNS proves nothing)."""
    cycle: int = 1
    """Replay cycle of `ops` (iterations per repetition of its steady state)."""
    neighbourhoods: int = 0
    accepted: int = 0
    improved: int = 0
    wall_s: float = 0.0
    parameters: dict[str, Any] = field(default_factory=dict)
    sub_status: dict[str, int] = field(default_factory=dict)
    """CP-SAT status name -> how many sub-solves ended so."""


# --------------------------------------------------------------------------------------------- base


def make_base(job: JobSpec, orders: Orders, period_ms: float, scale: TimeScale) -> Base:
    timed: Retimed = steady_state(job, orders, period_ms)
    units = scale.scale
    start: dict[Key, int] = {}
    worker: dict[Key, Worker] = {}
    allreduce: dict[int, int] = {}
    for op in timed.ops:
        if op.microbatch is None:
            if op.kind == "ALLREDUCE":
                allreduce[op.worker[1]] = round(op.start_ms * units)
            continue
        key = (op.kind, op.microbatch[0], op.microbatch[1], op.worker[1])
        start[key] = round(op.start_ms * units)
        worker[key] = op.worker
    span = max(round(timed.optimizer_end[w] * units) - round(timed.first_start[w] * units)
               for w in timed.optimizer_end)
    return Base(orders, period_ms, start, worker, allreduce, span)


# ---------------------------------------------------------------------------------- neighbourhoods


def choose_free(base: Base, kind: str, size: int, stages: int, rng: random.Random) -> set[Key]:
    """`size` compute ops by start time: from a random op on (window), on a random band of
    stages (stages), or the last ones of the iteration (tail)."""
    keys = sorted(base.start, key=lambda k: base.start[k])
    if kind == "stages":
        width = max(1, min(stages, 2 + rng.randrange(2)))
        low = rng.randrange(stages - width + 1)
        keys = [k for k in keys if low <= k[3] < low + width]
    if kind == "tail":
        return set(keys[-size:])
    first = rng.randrange(max(1, len(keys) - size + 1))
    return set(keys[first:first + size])


# ---------------------------------------------------------------------------------------- search


def _edges(job: JobSpec, base: Base, scale: TimeScale):
    rule3 = needs(job.costs, job.stages)
    preds: dict[Key, list[tuple[Key, int]]] = defaultdict(list)
    succs: dict[Key, list[tuple[Key, int]]] = defaultdict(list)
    for key, w in base.worker.items():
        kind, home, m, s = key
        need = rule3.get((kind, s))
        if need is None:
            continue
        u = (need.source, home, m, need.source_stage)
        delay = scale.down(need.delay(base.worker[u][0], w[0]))
        preds[key].append((u, delay))
        succs[u].append((key, delay))
    return preds, succs


def _orders_from(sub: OrderSub, solver: cp_model.CpSolver) -> Orders:
    placed: dict[Worker, list[tuple[int, Key]]] = defaultdict(list)
    for key, w in sub.base.worker.items():
        t = solver.Value(sub.start[key])
        placed[w].append((t, key))
    orders = {w: [k for _, k in sorted(seq)] for w, seq in placed.items()}
    for w in sub.base.orders:  # a worker that serves nothing keeps its all-reduce (rule 5)
        orders.setdefault(w, [])
    return orders


def _period(job: JobSpec, orders: Orders) -> tuple[float, list[Op], int] | None:
    try:
        ops = retime(job, orders).ops
        report = replay(job, ops)
    except (OrderCycle, ReplayError):
        return None
    if not report.converged:
        return None
    return report.iteration_ms, ops, report.cycle


def improve_lns(
    job: JobSpec,
    failed: tuple[Worker, ...],
    hint_ops: list[Op],
    hint_period_ms: float,
    bound_ms: float,
    time_limit_s: float,
    seed: int,
    *,
    max_neighbourhoods: int | None = None,
    sub_deterministic_time: float | None = None,
) -> LnsResult:
    """Improve `hint_ops` (routing fixed) within `time_limit_s`.

    `max_neighbourhoods` and `sub_deterministic_time` make a run reproducible (tests): a fixed
    number of sub-models, each with CP-SAT's deterministic time limit and one search worker (the
    wall limit is then only a safety cap)."""
    started = time.perf_counter()
    deadline = started + time_limit_s
    rng = random.Random(seed)
    scale = choose_scale(job)
    orders = orders_of(hint_ops)
    base = make_base(job, orders, hint_period_ms, scale)
    routes = {(k[1], k[2], k[3]): (w[0],) for k, w in base.worker.items() if k[0] == "F"}
    inst = Instance(job, tuple(failed), scale, routes)
    preds, _ = _edges(job, base, scale)
    best_ops, best_period = hint_ops, hint_period_ms
    current = hint_period_ms
    # Presolve off: the sub-model is difference constraints plus a few literals, and CP-SAT's
    # presolve spent 1.3 s of dual-strengthening loops on an 8 x 8 x 24 one that then solved in 0.4.
    params: dict[str, Any] = {"num_workers": 1, "random_seed": seed, "cp_model_presolve": False,
                              "log_search_progress": False}
    sub_time = SUB_TIME_S + SUB_TIME_PER_OP_S * job.op_count
    if sub_deterministic_time is not None:
        params["max_deterministic_time"] = sub_deterministic_time
    result = LnsResult(None, hint_period_ms, SolveStatus.HEURISTIC,
                       parameters={**params, "sub_time_s": sub_time, "free_ops": FREE_OPS,
                                   "kinds": KINDS, "time_units_per_ms": scale.scale})
    step = 0
    build_s = 0.0
    while best_period > bound_ms + 1e-6:
        left = deadline - time.perf_counter()
        if max_neighbourhoods is not None and step >= max_neighbourhoods:
            break
        if left < 0.05 + build_s:  # keep within the limit: a sub-model costs its build time too
            break
        kind = KINDS[step % len(KINDS)]
        size = FREE_OPS[(step // len(KINDS)) % len(FREE_OPS)]
        step += 1
        free = choose_free(base, kind, size, job.stages, rng)
        built = time.perf_counter()
        sub = build_order_sub(job, base, free, scale, inst, preds)
        build_s = time.perf_counter() - built
        left = deadline - time.perf_counter()
        solver = cp_model.CpSolver()
        for name, value in params.items():
            setattr(solver.parameters, name, value)
        # CP-SAT overshoots its wall limit under load (cpsat.SOLVER_OVERSHOOT), and an accepted
        # plan still has to be re-timed and replayed (0.2 s on 8 x 8 x 24): keep both back.
        solver.parameters.max_time_in_seconds = max(0.01, min(sub_time, (1 - SOLVER_OVERSHOOT) * left
                                                              - build_s - 0.05)) \
            if sub_deterministic_time is None else max(0.01, left)
        status = solver.Solve(sub.cp)
        name = solver.StatusName(status)
        result.sub_status[name] = result.sub_status.get(name, 0) + 1
        result.neighbourhoods += 1
        if status not in (cp_model.OPTIMAL, cp_model.FEASIBLE):
            continue
        new_orders = _orders_from(sub, solver)
        if new_orders == base.orders:
            continue
        measured = _period(job, new_orders)
        if measured is None or measured[0] > current + 1e-6:
            continue
        period, ops, cycle = measured
        result.accepted += 1
        current = period
        base = make_base(job, new_orders, period, scale)
        if period < best_period - 1e-6:
            result.improved += 1
            best_ops, best_period, result.cycle = ops, period, cycle
    if best_period < hint_period_ms - 1e-6:
        result.ops, result.period_ms, result.status = best_ops, best_period, SolveStatus.IMPROVED
    result.wall_s = time.perf_counter() - started
    return result


# ------------------------------------------------------------- order-fixed sub-models (whole plan)


@dataclass
class OrderSub:
    """Every op is timed, but only the free ops may change places: outside the window each worker
    keeps its order as a chain of difference constraints (no intervals, no literals), so the
    period itself can move (the whole plan shifts around the window)."""

    base: Base
    inst: Instance
    free: set[Key]
    cp: cp_model.CpModel = field(default_factory=cp_model.CpModel)
    start: dict[Key, Any] = field(default_factory=dict)
    allreduce: dict[int, Any] = field(default_factory=dict)
    period: Any = None
    horizon: int = 0
    pairs: list = field(default_factory=list)
    """(literal "g before f", its value in the base) for the hint."""

    def duration(self, key: Key) -> int:
        return self.inst.duration[key[0]][key[3]]

    def end(self, key: Key) -> Any:
        return self.start[key] + self.duration(key)


def order_variables(sub: OrderSub) -> None:
    cp, base = sub.cp, sub.base
    sub.horizon = max(base.start.values()) + 2 * base.span
    for key in base.start:
        sub.start[key] = cp.NewIntVar(0, sub.horizon, "")
    for s in base.allreduce:
        sub.allreduce[s] = cp.NewIntVar(0, sub.horizon, "")
    sub.period = cp.NewIntVar(0, base.span, "period")


def order_precedences(sub: OrderSub, preds: dict[Key, list[tuple[Key, int]]]) -> None:
    """Rule 3 on every edge."""
    for key, edges in preds.items():
        for u, delay in edges:
            sub.cp.Add(sub.start[key] >= sub.end(u) + delay)


def order_workers(sub: OrderSub) -> dict[Worker, list[Key]]:
    """Rule 4: each worker's fixed ops in their order; its free ops (a contiguous run of its order,
    the window) between the fixed op before and the one after, in any order among themselves.
    Returns each worker's fixed ops in order."""
    cp = sub.cp
    fixed_seq: dict[Worker, list[Key]] = {}
    for w, seq in sub.base.orders.items():
        fixed = [k for k in seq if k not in sub.free]
        free = [i for i, k in enumerate(seq) if k in sub.free]
        fixed_seq[w] = fixed
        for u, v in zip(fixed, fixed[1:], strict=False):
            cp.Add(sub.start[v] >= sub.end(u))
        if not free:
            continue
        before = seq[free[0] - 1] if free[0] > 0 else None
        after = seq[free[-1] + 1] if free[-1] + 1 < len(seq) else None
        intervals = []
        for i in free:
            k = seq[i]
            if before is not None:
                cp.Add(sub.start[k] >= sub.end(before))
            if after is not None:
                cp.Add(sub.start[after] >= sub.end(k))
            intervals.append(cp.NewFixedSizeIntervalVar(sub.start[k], sub.duration(k), ""))
        cp.AddNoOverlap(intervals)  # also where memory's pair literals order them: far stronger
        # propagation (a 1 x 3 x 6 sub-model with every op free: optimal in 0.23 deterministic s
        # with it, not proven in 1.0 without)
    return fixed_seq


def order_collectives(sub: OrderSub) -> None:
    """Rule 5: a stage's all-reduce after every op of the stage (collectives come last)."""
    for key in sub.base.start:
        sub.cp.Add(sub.allreduce[key[3]] >= sub.end(key))


def order_memory(sub: OrderSub) -> None:
    """Rule 6 in order terms: memory grows only when an F starts, and on a worker every op before
    it in its order has ended by then, so the held memory at each F start is fixed by the order.
    Outside the window it is the base's (valid); for an F inside the window it is what the ops
    before the window hold, plus this F, plus each other free op of the worker placed before it
    (a literal per ordered pair of the worker's free ops)."""
    cp, inst = sub.cp, sub.inst
    for w, seq in sub.base.orders.items():
        free = [k for k in seq if k in sub.free]
        cap = inst.memory_cap[w[1]]
        if len(free) < 2 or cap is None:
            continue
        full, part = inst.memory_demand[w[1]]
        delta = {"F": full, "B": part - full, "W": -part}
        held = sum(delta[k[0]] for k in seq[:seq.index(free[0])])
        before = {}
        for i, g in enumerate(free):
            for f in free[i + 1:]:
                lit = cp.NewBoolVar("")
                before[(g, f)], before[(f, g)] = lit, lit.Not()
                cp.Add(sub.start[f] >= sub.end(g)).OnlyEnforceIf(lit)
                cp.Add(sub.start[g] >= sub.end(f)).OnlyEnforceIf(lit.Not())
                sub.pairs.append((lit, sub.base.start[g] < sub.base.start[f]))
        for f in free:
            if f[0] == "F" and held + full + sum(max(0, delta[g[0]]) for g in free if g != f) > cap:
                cp.Add(held + full + sum(delta[g[0]] * before[(g, f)] for g in free if g != f) <= cap)


def order_objective(sub: OrderSub, alive: list[Worker]) -> None:
    """Every worker's span at most the period (its first op: the first of its order, or any of
    its free ops when the window reaches its start); minimise the period. Stage 0's all-reduce
    is pinned to the period's end (time-shift symmetry)."""
    cp, inst = sub.cp, sub.inst
    for w in alive:
        s = w[1]
        tail = inst.duration["ALLREDUCE"][s] + inst.duration["OPTIMIZER"][s]
        seq = sub.base.orders.get(w, [])
        if not seq:
            continue
        heads = [k for k in seq if k in sub.free] if seq[0] in sub.free else [seq[0]]
        for k in heads:
            cp.Add(sub.period >= sub.allreduce[s] + tail - sub.start[k])
    tail0 = inst.duration["ALLREDUCE"][0] + inst.duration["OPTIMIZER"][0]
    cp.Add(sub.allreduce[0] + tail0 == sub.period)
    cp.Minimize(sub.period)


def order_hint(sub: OrderSub) -> None:
    """The base schedule, shifted so that stage 0's all-reduce ends its span at the period."""
    inst, base = sub.inst, sub.base
    shift = base.span - base.allreduce[0] - inst.duration["ALLREDUCE"][0] - inst.duration["OPTIMIZER"][0]
    for key, var in sub.start.items():
        sub.cp.AddHint(var, base.start[key] + shift)
    for s, var in sub.allreduce.items():
        sub.cp.AddHint(var, base.allreduce[s] + shift)
    sub.cp.AddHint(sub.period, sub.base.span)
    for lit, value in sub.pairs:
        sub.cp.AddHint(lit, value)


def build_order_sub(job: JobSpec, base: Base, free: set[Key], scale: TimeScale, inst: Instance,
                    preds: dict[Key, list[tuple[Key, int]]]) -> OrderSub:
    sub = OrderSub(base, inst, free)
    order_variables(sub)
    order_precedences(sub, preds)
    order_memory(sub)
    order_workers(sub)
    order_collectives(sub)
    order_objective(sub, inst.alive_workers)
    order_hint(sub)
    return sub
