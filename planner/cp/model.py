"""The CP-SAT model of one iteration, built in steps: variables, one function per constraint
family (rules 1-6 of the contract), the period objective, symmetry breaking, and the warm start.

Time is in integer units (see `timing`): durations and hops rounded down, so the model is a
relaxation and its proven bound holds for the real problem. Each compute triple (F, B, W of one
home pipeline, micro-batch and stage) is a `Task`: three start variables shared by one optional
interval per candidate executor, so the routing choice is a single literal per candidate.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ortools.sat.python import cp_model

from planner.cp.orders import Retimed
from planner.cp.timing import MAX_UNITS, TimeScale
from planner.precedence import BARRIER_SOURCE, Need, needs
from planner.spec import JobSpec, Worker
from planner.timeline import COMPUTE_KINDS

if TYPE_CHECKING:
    from planner.cp.cpsat import SymmetryRule

TaskKey = tuple[int, int, int]
"""(home pipeline, micro-batch index, stage)."""


class ModelTooLarge(ValueError):
    """The job's times do not fit the model's integer range."""


@dataclass
class Instance:
    """The job in model units plus the candidate executors of every task."""

    job: JobSpec
    failed: tuple[Worker, ...]
    scale: TimeScale
    routes: dict[TaskKey, tuple[int, ...]]
    """Candidate executor pipelines per task: (home,) when fixed, the alive peers when re-routed."""
    duration: dict[str, list[int]] = field(init=False)
    memory_cap: list[int | None] = field(init=False)
    """Capacity of a stage-s worker in memory units; None when memory cannot bind."""
    memory_demand: list[tuple[int, int]] = field(init=False)
    """(units held from F start to B end, units held from B end to W end) per stage."""
    memory_exact: bool = field(init=False)
    """Whether the units represent rule 6 exactly (else demands are rounded up, capacity down: the
    model is then stricter than the contract and its bound is not a bound of the real problem)."""

    def __post_init__(self) -> None:
        costs, down = self.job.costs, self.scale.down
        S = self.job.stages
        self.duration = {k: [down(costs.duration(k, s)) for s in range(S)]
                         for k in (*COMPUTE_KINDS, "ALLREDUCE", "OPTIMIZER")}
        most = defaultdict(int)
        for (_, _, s), cands in self.routes.items():
            for q in cands:
                most[(q, s)] += 1
        self.memory_cap, self.memory_demand, self.memory_exact = [], [], True
        for s in range(S):
            act, act_w = costs.activation[s], costs.activation_w[s]
            most_here = max((n for (_, st), n in most.items() if st == s), default=0)
            if act <= 0 or most_here * act <= costs.memory_limit_mb:
                self.memory_cap.append(None)  # even every candidate at once fits
                self.memory_demand.append((0, 0))
                continue
            if act_w == act:
                # One count: every micro-batch holds `act` from F start to W end. The largest
                # count whose float sum the validator accepts (it sums act `cap` times).
                cap = math.floor(costs.memory_limit_mb / act + 1e-9)
                while cap * act > costs.memory_limit_mb + 1e-7:
                    cap -= 1
                self.memory_cap.append(cap)
                self.memory_demand.append((1, 1))
                continue
            unit, exact = _memory_unit(act, act_w, costs.memory_limit_mb)
            self.memory_exact &= exact
            self.memory_cap.append(math.floor(costs.memory_limit_mb / unit + 1e-9))
            self.memory_demand.append((math.ceil(act / unit - 1e-9), math.ceil(act_w / unit - 1e-9)))

    @property
    def alive_workers(self) -> list[Worker]:
        dead = set(self.failed)
        return [w for w in self.job.workers() if w not in dead]

    def work(self, s: int) -> int:
        return sum(self.duration[k][s] for k in COMPUTE_KINDS)

    def horizon(self, period_cap: int) -> int:
        """All times fit in [0, 2 x cap] once stage 0's window starts at 0: every op of a micro-batch
        at stage s precedes its stage-0 B, so the stage's window starts no later than
        ALLREDUCE_0 <= cap, and everything of stage s ends by ALLREDUCE_s <= that start + P."""
        total = 2 * period_cap
        if total > MAX_UNITS:
            raise ModelTooLarge(f"time horizon of {total} units at scale {self.scale.scale} is too large")
        return total


def _memory_unit(act: float, act_w: float, limit: float) -> tuple[float, bool]:
    """A unit in which activation, activation_w and the limit are all whole numbers (exact), else
    act / 1000 with demands to be rounded up and the capacity down (not exact)."""
    for denominator in (1, 2, 4, 5, 8, 10, 16, 20, 25, 32, 50, 64, 100, 128, 1000):
        unit = 1.0 / denominator
        if all(abs(x / unit - round(x / unit)) < 1e-9 * max(1.0, x / unit) for x in (act, act_w, limit)):
            return unit, True
    return act / 1000, False


def full_routes(job: JobSpec, failed: Sequence[Worker]) -> dict[TaskKey, tuple[int, ...]]:
    """Complete routing (rule 1): every micro-batch may run on any alive worker of each stage.

    Only a model with these candidates proves a bound for every valid plan: keeping a micro-batch
    on its alive home worker is not without loss (dissolving a damaged pipeline moves micro-batches
    of alive workers, and a cross-pipeline hop may be cheaper than a same-pipeline one).
    """
    dead = set(failed)
    peers = [tuple(q for q in range(job.pipelines) if (q, s) not in dead) for s in range(job.stages)]
    return {(p, m, s): peers[s]
            for p in range(job.pipelines) for m in range(job.microbatches) for s in range(job.stages)}


@dataclass
class Task:
    key: TaskKey
    choice: dict[int, cp_model.IntVar | None]
    """Presence literal per candidate executor pipeline (None: the only candidate)."""
    start: dict[str, cp_model.IntVar]


@dataclass
class Model:
    inst: Instance
    cp: cp_model.CpModel
    period_cap: int
    period_floor: int
    horizon: int = 0
    tasks: dict[TaskKey, Task] = field(default_factory=dict)
    intervals: dict[Worker, list[cp_model.IntervalVar]] = field(default_factory=lambda: defaultdict(list))
    memory: dict[Worker, list[cp_model.IntervalVar]] = field(default_factory=lambda: defaultdict(list))
    memory_size: dict[TaskKey, cp_model.IntVar] = field(default_factory=dict)
    """Per task: F start -> W end (one count), or F start -> B end when activation_w differs."""
    memory_w_size: dict[TaskKey, cp_model.IntVar] = field(default_factory=dict)
    """Per task when activation_w differs from activation: B end -> W end."""
    memory_demand: dict[Worker, list[int]] = field(default_factory=lambda: defaultdict(list))
    allreduce: dict[int, cp_model.IntVar] = field(default_factory=dict)
    period: cp_model.IntVar | None = None

    def end(self, task: Task, kind: str) -> cp_model.LinearExpr:
        return task.start[kind] + self.inst.duration[kind][task.key[2]]


def build(inst: Instance, period_cap: int, period_floor: int, symmetry: SymmetryRule = "per_home") -> Model:
    model = Model(inst, cp_model.CpModel(), period_cap, min(period_floor, period_cap))
    model.horizon = inst.horizon(period_cap)
    add_tasks(model)
    add_routing(model)
    add_precedences(model)
    add_collectives(model)
    add_no_overlap(model)
    add_memory(model)
    add_period_objective(model)
    if symmetry != "none":
        add_symmetry_breaking(model, across_homes=symmetry == "across_homes")
    return model


# ----------------------------------------------------------------------------------------- variables


def add_tasks(model: Model) -> None:
    """Start variables of F/B/W, one optional interval per candidate executor (rules 1, 2)."""
    cp, inst, H = model.cp, model.inst, model.horizon
    for key, cands in inst.routes.items():
        p, m, s = key
        name = f"{p}_{m}_{s}"
        start = {k: cp.NewIntVar(0, H, f"{k}{name}") for k in COMPUTE_KINDS}
        choice = {q: (cp.NewBoolVar(f"on{q}_{name}") if len(cands) > 1 else None) for q in cands}
        task = Task(key, choice, start)
        model.tasks[key] = task
        for q, lit in choice.items():
            for k in COMPUTE_KINDS:
                size = inst.duration[k][s]
                model.intervals[(q, s)].append(
                    cp.NewFixedSizeIntervalVar(start[k], size, f"i{k}{name}_{q}") if lit is None
                    else cp.NewOptionalFixedSizeIntervalVar(start[k], size, lit, f"i{k}{name}_{q}")
                )


# ------------------------------------------------------------------------------ constraint families


def add_routing(model: Model) -> None:
    """Rule 1: exactly one executor per task; F, B and W share it because they share the literal."""
    for task in model.tasks.values():
        lits = [lit for lit in task.choice.values() if lit is not None]
        if lits:
            model.cp.AddExactlyOne(lits)


def _after(model: Model, earlier: Task, need: Need, later: Task) -> None:
    """`later` (op `need.kind`) starts after `earlier` (op `need.source`) ends plus the need's delay.

    The hop depends on whether the two executors' pipelines differ; where either end may move we
    post the smallest hop unconditionally (good propagation) and each larger one under the pair of
    presence literals that selects it. Without a hop both ops share one task's executor.
    """
    cp, down = model.cp, model.inst.scale.down
    end, start = model.end(earlier, need.source), later.start[need.kind]
    if not need.hop:
        cp.Add(start >= end)
        return
    delays = {(a, b): down(need.delay(a, b)) for a in earlier.choice for b in later.choice}
    least = min(delays.values())
    cp.Add(start >= end + least)
    for (a, b), delay in delays.items():
        if delay > least:
            enforce = [x for x in (earlier.choice[a], later.choice[b]) if x is not None]
            cp.Add(start >= end + delay).OnlyEnforceIf(enforce)


def add_precedences(model: Model) -> None:
    """Rule 3 from the one precedence graph (planner/precedence.py): F(s-1) -> F(s), B(s+1) -> B(s)
    with hops; last-stage F -> B; B -> W."""
    job = model.inst.job
    rule3 = needs(job.costs, job.stages)
    for (p, m, s), task in model.tasks.items():
        for kind in COMPUTE_KINDS:
            need = rule3.get((kind, s))
            if need is not None:
                _after(model, model.tasks[(p, m, need.source_stage)], need, task)


def add_collectives(model: Model) -> None:
    """Rule 5: one ALLREDUCE start per stage, after every W of the stage; on every alive worker an
    ALLREDUCE interval there and the OPTIMIZER right after it."""
    cp, inst = model.cp, model.inst
    for s in range(inst.job.stages):
        model.allreduce[s] = cp.NewIntVar(0, model.horizon, f"ar{s}")
    for (_, _, s), task in model.tasks.items():
        cp.Add(model.allreduce[s] >= model.end(task, BARRIER_SOURCE))
    for w in inst.alive_workers:
        s = w[1]
        ar, d_ar = model.allreduce[s], inst.duration["ALLREDUCE"][s]
        model.intervals[w].append(cp.NewFixedSizeIntervalVar(ar, d_ar, f"ar{w}"))
        model.intervals[w].append(
            cp.NewFixedSizeIntervalVar(ar + d_ar, inst.duration["OPTIMIZER"][s], f"opt{w}"))


def add_no_overlap(model: Model) -> None:
    """Rule 4: a worker runs one op at a time (its F/B/W candidates plus ALLREDUCE and OPTIMIZER)."""
    for intervals in model.intervals.values():
        model.cp.AddNoOverlap(intervals)


def add_memory(model: Model) -> None:
    """Rule 6 as one cumulative per worker.

    All ops of a worker belong to one stage, so every micro-batch holds the same amounts there.
    With activation_w == activation a micro-batch holds one unit from F start to W end and the
    capacity is an exact count. Otherwise it holds `act` units from F start to B end and `act_w`
    units from B end to W end (two intervals), in a unit that makes both and the limit integral.
    """
    cp, inst = model.cp, model.inst
    for key, task in model.tasks.items():
        s = key[2]
        if inst.memory_cap[s] is None:
            continue
        full, part = inst.memory_demand[s]
        split = (full, part) != (1, 1)
        first_end = model.end(task, "B") if split else model.end(task, "W")
        low = inst.duration["F"][s] + inst.duration["B"][s] if split else inst.work(s)
        size = cp.NewIntVar(low, model.horizon, f"mem{key}")
        model.memory_size[key] = size
        pieces = [(task.start["F"], size, first_end, full, "")]
        if split and part > 0:
            size_w = cp.NewIntVar(inst.duration["W"][s], model.horizon, f"memw{key}")
            model.memory_w_size[key] = size_w
            pieces.append((model.end(task, "B"), size_w, model.end(task, "W"), part, "w"))
        for q, lit in task.choice.items():
            for start, length, end, demand, tag in pieces:
                name = f"m{tag}{key}_{q}"
                model.memory[(q, s)].append(
                    cp.NewIntervalVar(start, length, end, name) if lit is None
                    else cp.NewOptionalIntervalVar(start, length, end, lit, name)
                )
                model.memory_demand[(q, s)].append(demand)
    for w, intervals in model.memory.items():
        cp.AddCumulative(intervals, model.memory_demand[w], inst.memory_cap[w[1]])


def add_period_objective(model: Model) -> None:
    """The steady-state period: P >= (OPTIMIZER end - first op start) on every worker; minimize P.

    All alive workers of stage s end their OPTIMIZER at the same time (their common ALLREDUCE
    start plus AR_s + OPT_s), so "every worker's span <= P" is the same as "every F of stage s
    starts at or after ALLREDUCE_s + AR_s + OPT_s - P": one window per stage, whoever runs the op,
    with no per-worker first-start variable and no presence literal.
    Redundant but valid: P >= each worker's total work (linear in the routing literals), P >= the
    proven bound (floor) and P <= the heuristic's period (cap). Time-shift symmetry: stage 0's
    window starts at 0 (shift any solution so); see `horizon` for why 2 x cap then bounds all times.
    """
    cp, inst = model.cp, model.inst
    model.period = cp.NewIntVar(model.period_floor, model.period_cap, "period")
    tail = [inst.duration["ALLREDUCE"][s] + inst.duration["OPTIMIZER"][s] for s in range(inst.job.stages)]
    workload: dict[Worker, list] = defaultdict(list)
    for (_, _, s), task in model.tasks.items():
        cp.Add(task.start["F"] >= model.allreduce[s] + tail[s] - model.period)
        for q, lit in task.choice.items():
            workload[(q, s)].append(inst.work(s) * (1 if lit is None else lit))
    for w in inst.alive_workers:
        cp.Add(model.period >= sum(workload[w]) + tail[w[1]])
    cp.Add(model.allreduce[0] + tail[0] - model.period == 0)
    cp.Minimize(model.period)


def add_symmetry_breaking(model: Model, across_homes: bool) -> None:
    """Order interchangeable micro-batches; this keeps at least one optimal solution (see notes).

    A micro-batch's label enters no rule but coverage: any alive same-stage peer may serve it
    (rule 1), and durations, hops and memory depend on the stage and the executors, never on the
    home pipeline. So micro-batches with the same candidate executors at every stage are
    interchangeable: order their stage-0 F starts in label order, within one home pipeline or
    (`across_homes`) whatever their homes, which in the full model is all D x M of them. On one
    fixed worker the order is strict (they cannot overlap), so post it with F's length.
    Across homes proves far more (a 3 x 2 x 6 optimum in 28 s, unproven in 120 s per home) but
    finds worse plans in a few seconds (docs/notes/cpsat.md), so the planner orders per home.
    """
    cp, inst = model.cp, model.inst
    job = inst.job
    classes: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
    for p in range(job.pipelines):
        for m in range(job.microbatches):
            classes[symmetry_class(inst.routes, p, m, job.stages, across_homes)].append((p, m))
    for members in classes.values():
        gap = inst.duration["F"][0] if len(inst.routes[(*members[0], 0)]) == 1 else 0
        for a, b in zip(members, members[1:], strict=False):
            cp.Add(model.tasks[(*b, 0)].start["F"] >= model.tasks[(*a, 0)].start["F"] + gap)


def symmetry_class(routes: dict[TaskKey, tuple[int, ...]], p: int, m: int, stages: int,
                   across_homes: bool) -> tuple:
    """A micro-batch's class: its candidate executors at every stage, and its home unless
    `across_homes`."""
    signature = tuple(routes[(p, m, s)] for s in range(stages))
    return (signature,) if across_homes else (p, signature)


# -------------------------------------------------------------------------------------- warm start


def add_hint(model: Model, hint: Retimed) -> None:
    """`AddHint` on every variable from a valid plan in the model's canonical labelling, shifted so
    that stage 0's window starts at 0 as the model demands."""
    cp, inst = model.cp, model.inst

    def units(ms: float) -> int:
        return round(ms * inst.scale.scale)

    span = max(units(hint.optimizer_end[w]) - units(hint.first_start[w]) for w in hint.first_start)
    period = min(max(span, model.period_floor), model.period_cap)
    ar0 = min(units(o.start_ms) for o in hint.ops if o.kind == "ALLREDUCE" and o.worker[1] == 0)
    offset = ar0 + inst.duration["ALLREDUCE"][0] + inst.duration["OPTIMIZER"][0] - period

    def at(ms: float) -> int:
        return min(model.horizon, max(0, units(ms) - offset))

    cp.AddHint(model.period, period)
    allreduce_at: dict[int, int] = {}
    executor: dict[TaskKey, int] = {}
    f_start: dict[TaskKey, int] = {}
    b_end: dict[TaskKey, int] = {}
    for op in hint.ops:
        if op.microbatch is None:
            if op.kind == "ALLREDUCE":
                allreduce_at[op.worker[1]] = at(op.start_ms)
            continue
        key = (op.microbatch[0], op.microbatch[1], op.worker[1])
        task = model.tasks[key]
        cp.AddHint(task.start[op.kind], at(op.start_ms))
        executor[key] = op.worker[0]
        if op.kind == "F":
            f_start[key] = units(op.start_ms)
        elif op.kind == "B" and key in model.memory_w_size:
            b_end[key] = units(op.end_ms)
        elif op.kind == "W" and key in model.memory_w_size:
            cp.AddHint(model.memory_size[key], b_end[key] - f_start[key])
            cp.AddHint(model.memory_w_size[key], units(op.end_ms) - b_end[key])
        elif op.kind == "W" and key in model.memory_size:
            cp.AddHint(model.memory_size[key], units(op.end_ms) - f_start[key])
    for s, start in allreduce_at.items():
        cp.AddHint(model.allreduce[s], start)
    for key, task in model.tasks.items():
        for q, lit in task.choice.items():
            if lit is not None:
                cp.AddHint(lit, q == executor[key])
