"""Per-worker op orders and the exact-millisecond schedules they define.

The contract's period depends only on each worker's op order, so the CP side works with orders:
- `retime`: the earliest exact-ms schedule of given orders (valid by construction: rules 1-5 hold
  because every op waits for its predecessors, rule 6 because on one worker the memory held at
  each op depends only on the order).
- `steady_state`: the hint's times re-based so that every worker's span fits the replayed period
  (the model's objective is the largest span, so the raw heuristic times would overstate it).
- `relabel`: a plan rewritten into the symmetry-broken form the model enforces (same period).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass

from planner.precedence import BARRIER_SOURCE, collective_ops, needs
from planner.spec import JobSpec, Worker
from planner.timeline import Key, Op, Orders


class OrderCycle(ValueError):
    """The orders deadlock: a worker waits on an op that comes after its own."""


@dataclass
class Retimed:
    ops: list[Op]
    first_start: dict[Worker, float]
    optimizer_end: dict[Worker, float]

    @property
    def max_span(self) -> float:
        return max(self.optimizer_end[w] - self.first_start[w] for w in self.optimizer_end)


def retime(job: JobSpec, orders: Orders, ready: dict[Worker, float] | None = None) -> Retimed:
    """Every op as early as rules 3-5 allow, workers free from `ready` (default 0) on."""
    costs = job.costs
    where = {key: w for w, seq in orders.items() for key in seq}
    preds: dict[Key, list[tuple[Key, float]]] = defaultdict(list)
    succs: dict[Key, list[Key]] = defaultdict(list)

    def edge(u: Key, v: Key, delay: float) -> None:
        preds[v].append((u, delay))
        succs[u].append(v)

    for seq in orders.values():
        for u, v in zip(seq, seq[1:], strict=False):
            edge(u, v, 0.0)
    rule3 = needs(costs, job.stages)  # the one precedence graph (planner/precedence.py)
    for key, w in where.items():
        kind, home, m, s = key
        need = rule3.get((kind, s))
        if need is not None:
            u = (need.source, home, m, need.source_stage)
            edge(u, key, need.delay(where[u][0], w[0]))

    ready = ready or {}
    end: dict[Key, float] = {}
    start: dict[Key, float] = {}
    waiting = {key: len(preds[key]) for key in where}
    frontier = [key for key, n in waiting.items() if n == 0]
    while frontier:
        key = frontier.pop()
        t = max([ready.get(where[key], 0.0)] + [end[u] + d for u, d in preds[key]])
        start[key] = t
        end[key] = t + costs.duration(key[0], key[3])
        for v in succs[key]:
            waiting[v] -= 1
            if waiting[v] == 0:
                frontier.append(v)
    if len(end) != len(where):
        raise OrderCycle("op orders deadlock: a worker waits on an op ordered after its own")

    ops = [Op(where[k], k[0], (k[1], k[2]), start[k], end[k]) for w, seq in orders.items() for k in seq]
    first = {w: start[seq[0]] for w, seq in orders.items() if seq}
    opt_end: dict[Worker, float] = {}
    for s in sorted({w[1] for w in orders}):
        workers = [w for w in orders if w[1] == s]
        at = max(
            [end[k] for k in where if k[0] == BARRIER_SOURCE and k[3] == s]
            + [end[orders[w][-1]] if orders[w] else ready.get(w, 0.0) for w in workers]
        )
        stage_ops = collective_ops(costs, s, workers, at)
        ops += stage_ops
        for w, opt in zip(workers, stage_ops[1::2], strict=True):
            opt_end[w] = opt.end_ms
            first.setdefault(w, at)
    return Retimed(ops, first, opt_end)


def steady_state(job: JobSpec, orders: Orders, period_ms: float, iterations: int = 60) -> Retimed:
    """One iteration of the orders' back-to-back replay whose largest worker span is smallest.

    Each worker starts iteration i+1 when its own optimizer of iteration i ends, exactly as the
    contract's replay does; once the replay settles every span is at most the period. Times are
    shifted so that the earliest op starts at 0.
    """
    best = current = retime(job, orders)
    for _ in range(iterations):
        if best.max_span <= period_ms + 1e-9:
            break
        current = retime(job, orders, current.optimizer_end)
        if current.max_span < best.max_span - 1e-9:
            best = current
    shift = min(best.first_start.values())
    ops = [Op(o.worker, o.kind, o.microbatch, o.start_ms - shift, o.end_ms - shift) for o in best.ops]
    return Retimed(
        ops,
        {w: t - shift for w, t in best.first_start.items()},
        {w: t - shift for w, t in best.optimizer_end.items()},
    )


def relabel(ops: Sequence[Op], same_class: Callable[[int, int], Hashable]) -> list[Op]:
    """The same plan with micro-batch labels permuted into the form the model's symmetry breaking
    demands: within each class `same_class(home, m)` (across homes), the labels in (home, index)
    order go to the micro-batches in the order of their stage-0 forward starts. A label enters no
    rule but coverage, so validity and period are unchanged."""
    first_f = {o.microbatch: o.start_ms for o in ops if o.kind == "F" and o.worker[1] == 0}
    groups: dict[Hashable, list[tuple[int, int]]] = defaultdict(list)
    for label in sorted(first_f):
        groups[same_class(*label)].append(label)
    new_label: dict[tuple[int, int], tuple[int, int]] = {}
    for members in groups.values():
        by_start = sorted(members, key=lambda label: (first_f[label], label))
        new_label.update(zip(by_start, members, strict=True))
    return [Op(o.worker, o.kind, None if o.microbatch is None else new_label[o.microbatch],
               o.start_ms, o.end_ms) for o in ops]
