"""Discrete-event replay of any plan timeline, independent of how it was made.

`replay` takes only each worker's op *order* (by `start_ms`) and runs back-to-back iterations with
every op as early as rules 3-5 allow, a worker starting iteration i+1 right after its own OPTIMIZER
of iteration i; the period is the distance between the ends of consecutive iterations once it
settles. The six-rule check is `planner.validate`; per-worker memory is `validate.peak_memory`.

The replay is a max-plus recurrence over a DAG, so it is evaluated level by level with numpy: a
32 x 16 x 64 plan (~100k ops) replays an iteration in tens of milliseconds. Narrow graphs (one
pipeline: hundreds to thousands of levels a few nodes wide) are walked node by node and edge by edge
in plain Python instead, with the same additions and maxima in the same order, so the same floats
(`NUMPY_LEVELS_MIN_CHAINS`, `NUMPY_ITERATION_MIN_EDGES_PER_LEVEL`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter

import numpy as np

from planner.precedence import BARRIER_SOURCE, INPUTS, needs
from planner.spec import JobSpec, Worker
from planner.timeline import Op


@dataclass
class _Graph:
    """The op DAG of one iteration, in level order, ready for vectorized evaluation."""

    duration: np.ndarray
    first_of_worker: np.ndarray  # op index -> worker slot, or -1 when not the worker's first op
    last_of_worker: np.ndarray  # worker slot -> index of its final op
    sources: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    """Level-0 nodes (no predecessor)."""
    levels: list[tuple[np.ndarray, ...]] = field(default_factory=list)
    """Levels 1.. : (targets, edge sources, edge delays, reduceat offsets, positions among the
    targets of workers' first ops, those workers' slots); empty when `by_edge` is set."""
    workers: list[Worker] = field(default_factory=list)
    slot: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    """Op index (in `ops` order) -> worker slot (index into `workers`)."""
    span: np.ndarray = field(default_factory=lambda: np.empty(0))
    """Each op's written end - start (for busy times), in `ops` order."""
    by_edge: tuple[list[int], list[int], list[int], list[float], list[int]] | None = None
    """For graphs of narrow levels (`NUMPY_ITERATION_MIN_EDGES_PER_LEVEL`): the level-0 nodes, then
    the edges' sources, targets and delays sorted by (target's level, target), and
    `first_of_worker`, as lists, so that `_run_iteration` evaluates edge by edge."""


class ReplayError(ValueError):
    """The op orders deadlock (a cycle through worker order and data dependencies)."""


_KIND_CODE = {"F": 0, "B": 1, "W": 2, "ALLREDUCE": 3, "OPTIMIZER": 4}


def _columns(ops: Sequence[Op], M: int) -> tuple[np.ndarray, ...]:
    """(kind code, pipeline, stage, micro-batch home * M + index or -1, start, end) per op: one
    attribute pass each (a 100k-op plan: ~35 ms, a third of building one row tuple per op)."""
    n = len(ops)
    kind = np.fromiter(map(_KIND_CODE.__getitem__, map(_kind_of, ops)), np.int64, n)
    workers = list(map(_worker_of, ops))
    pipe = np.fromiter(map(_first, workers), np.int64, n)
    stage = np.fromiter(map(_second, workers), np.int64, n)
    mbs = [_NO_MB if mb is None else mb for mb in map(_mb_of, ops)]
    mb = np.fromiter(map(_first, mbs), np.int64, n) * M + np.fromiter(map(_second, mbs), np.int64, n)
    start = np.fromiter(map(_start_of, ops), np.float64, n)
    end = np.fromiter(map(_end_of, ops), np.float64, n)
    return kind, pipe, stage, mb, start, end


_kind_of, _worker_of, _mb_of = attrgetter("kind"), attrgetter("worker"), attrgetter("microbatch")
_start_of, _end_of = attrgetter("start_ms"), attrgetter("end_ms")
_first, _second = itemgetter(0), itemgetter(1)
_NO_MB = (0, -1)  # home * M + index = -1: no micro-batch
_KIND_RANK = np.array([0, 0, 0, 1, 2])  # timeline.worker_orders: compute ops before collectives


def _worker_order(kind: np.ndarray, pipe: np.ndarray, stage: np.ndarray, start: np.ndarray,
                  end: np.ndarray) -> np.ndarray:
    """Op indices in `timeline.worker_orders` order: workers sorted, each worker's ops by start,
    end, compute before ALLREDUCE before OPTIMIZER, ties in input order (lexsort is stable)."""
    return np.lexsort((_KIND_RANK[kind], end, start, stage, pipe))


def _build_graph(job: JobSpec, ops: Sequence[Op]) -> _Graph:
    """Nodes are the ops (per worker, in order) plus one sync node per stage; edges carry delays.

    Built with array operations: a 100k-op plan has ~400k edges, too many for per-edge Python.
    The per-worker order is `timeline.worker_orders`' (workers sorted; by start, end, compute
    before collectives; ties in input order), computed with one stable `np.lexsort`.
    """
    costs = job.costs
    S, DM = job.stages, job.pipelines * job.microbatches
    M = job.microbatches
    n = len(ops)
    kind, pipe, stage, mb, start_ms, end_ms = _columns(ops, M)
    order = _worker_order(kind, pipe, stage, start_ms, end_ms)
    kind, pipe, stage, mb = kind[order], pipe[order], stage[order], mb[order]
    span = end_ms[order] - start_ms[order]
    # Durations are the job's (rule 2), not the written end - start: the validator accepts written
    # times within 1e-6 ms, and a replay of shortened ops could come out below the proven bound.
    by_kind = np.array([[costs.duration(k, s) for s in range(S)] for k in _KIND_CODE], dtype=np.float64)
    duration_ops = by_kind[kind, stage] if n else np.zeros(0)
    new_worker = np.r_[True, (pipe[1:] != pipe[:-1]) | (stage[1:] != stage[:-1])] if n \
        else np.zeros(0, bool)
    slot = np.cumsum(new_worker) - 1
    workers: list[Worker] = list(zip(pipe[new_worker].tolist(), stage[new_worker].tolist(), strict=True))

    is_ar = kind == 3
    # The stages with an ALLREDUCE, sorted (np.unique's answer; np.unique imports numpy.ma, ~15 ms).
    ar_stages = np.flatnonzero(np.bincount(stage[is_ar], minlength=S))
    sync_of_stage = np.full(S, -1, dtype=np.int64)
    sync_of_stage[ar_stages] = n + np.arange(ar_stages.size)
    total = n + ar_stages.size

    compute = kind <= 2
    table = np.full(3 * DM * S, -1, dtype=np.int64)
    table[(kind[compute] * DM + mb[compute]) * S + stage[compute]] = np.flatnonzero(compute)

    def lookup(k: int, sel: np.ndarray, at_stage: np.ndarray) -> np.ndarray:
        found = table[(k * DM + mb[sel]) * S + at_stage]
        if (found < 0).any():
            raise ReplayError("plan is missing an F/B op that another op depends on")
        return found

    srcs, dsts, delays = [], [], []
    # Worker order: each op after the previous one on its worker; an ALLREDUCE after its stage's sync.
    same = np.flatnonzero(slot[1:] == slot[:-1]) + 1
    plain = same[~is_ar[same]]
    srcs += [plain - 1]
    dsts += [plain]
    delays += [np.zeros(plain.size)]
    into_sync = same[is_ar[same]]
    srcs += [into_sync - 1]
    dsts += [sync_of_stage[stage[into_sync]]]
    delays += [np.zeros(into_sync.size)]
    ar = np.flatnonzero(is_ar)
    srcs += [sync_of_stage[stage[ar]]]
    dsts += [ar]
    delays += [np.zeros(ar.size)]
    # Rule 3, one numpy mask per rule of the one precedence graph (planner/precedence.py).
    rule3 = needs(costs, S)
    for rule in INPUTS:
        sel = np.flatnonzero((kind == _KIND_CODE[rule.kind]) & rule.applies(stage, S - 1))
        src = lookup(_KIND_CODE[rule.source], sel, stage[sel] + rule.offset)
        srcs += [src]
        dsts += [sel]
        if rule.offset:
            hop = [rule3.get((rule.kind, t)) for t in range(S)]  # None where the rule does not bind
            hop_same = np.array([0.0 if h is None else h.same_ms for h in hop])
            hop_cross = np.array([0.0 if h is None else h.cross_ms for h in hop])
            at = stage[sel]
            delays += [np.where(pipe[src] != pipe[sel], hop_cross[at], hop_same[at])]
        else:
            delays += [np.zeros(sel.size)]
    # Rule 5: every W of a stage -> the stage's sync node -> its ALLREDUCEs (above).
    w_ops = np.flatnonzero(kind == _KIND_CODE[BARRIER_SOURCE])
    w_sync = w_ops[sync_of_stage[stage[w_ops]] >= 0]
    srcs += [w_sync]
    dsts += [sync_of_stage[stage[w_sync]]]
    delays += [np.zeros(w_sync.size)]

    src_a = np.concatenate(srcs).astype(np.int64)
    dst_a = np.concatenate(dsts).astype(np.int64)
    delay_a = np.concatenate(delays).astype(np.float64)
    duration = np.zeros(total)
    duration[:n] = duration_ops
    first = np.full(total, -1, dtype=np.int64)
    starts = np.flatnonzero(np.r_[True, slot[1:] != slot[:-1]]) if n else np.zeros(0, np.int64)
    first[starts] = slot[starts]
    last = np.r_[starts[1:] - 1, n - 1] if n else np.zeros(0, np.int64)
    level = _levels(total, src_a, dst_a, len(workers))
    graph = _Graph(
        duration=duration,
        first_of_worker=first,
        last_of_worker=last,
        workers=workers,
        slot=slot,
        span=span,
    )
    order = np.lexsort((dst_a, level[dst_a]))
    src_a, dst_a, delay_a = src_a[order], dst_a[order], delay_a[order]
    graph.sources = np.flatnonzero(level == 0)
    if src_a.size < NUMPY_ITERATION_MIN_EDGES_PER_LEVEL * max(1, int(level.max(initial=0))):
        graph.by_edge = (graph.sources.tolist(), src_a.tolist(), dst_a.tolist(), delay_a.tolist(),
                         first.tolist())
        return graph
    edge_level = level[dst_a]
    bounds = np.searchsorted(edge_level, np.arange(level.max() + 2)) if total else np.zeros(1, int)
    # Each level's targets and reduceat offsets (what np.unique(dst[a:b], return_index=True) gives
    # per level), from the positions where the sorted targets change, found once for all levels.
    change = np.flatnonzero(np.r_[True, dst_a[1:] != dst_a[:-1]]) if dst_a.size else dst_a
    cuts = np.searchsorted(change, bounds)
    # A worker's first op also waits for the worker's ready time: those few targets per level.
    is_first = first[dst_a[change]] >= 0 if dst_a.size else np.zeros(0, bool)
    for lv in range(1, int(level.max()) + 1 if total else 0):
        a, b = bounds[lv], bounds[lv + 1]
        at = change[cuts[lv]:cuts[lv + 1]]
        targets = dst_a[at]
        firsts = np.flatnonzero(is_first[cuts[lv]:cuts[lv + 1]])
        graph.levels.append((targets, src_a[a:b], delay_a[a:b], at - a, firsts, first[targets[firsts]]))
    return graph


NUMPY_LEVELS_MIN_CHAINS = 40
"""`_levels` runs its rounds with numpy from this many chains (workers) up, node by node in plain
Python below. A round holds at most one node per chain (a worker's ops are at consecutive levels)
plus a few sync nodes, and costs ~20 us with numpy whatever its size against ~0.45 us per node in
Python: one pipeline of 16 stages (6,192 nodes, 835 levels) 13 ms against 3 ms, of 32 stages
(12,384 nodes) 21 against 9.5 ms; 8 x 8 x 24 (62 chains) 1.7 against 1.9 ms; 32 x 8 x 64 (49,670
nodes) 8 against 26 ms."""

NUMPY_ITERATION_MIN_EDGES_PER_LEVEL = 64
"""`_run_iteration` goes level by level with numpy (~6.6 us a level) where the levels hold this
many edges on average, edge by edge in plain Python (~0.1 us an edge) where they hold fewer: a
8 x 8 x 24 plan (108 edges a level) 0.66 ms against 1.0 ms an iteration, one pipeline of 16
stages (4-17 a level) 10 ms against 3 ms."""


def _levels(total: int, src: np.ndarray, dst: np.ndarray,
            chains: int = NUMPY_LEVELS_MIN_CHAINS) -> np.ndarray:
    """Longest-path depth of each node (Kahn's algorithm, one frontier per round); raises on a cycle.

    A node leaves the frontier in round r exactly when its deepest predecessor is at depth r - 1,
    so the round number is the level. `chains`: how many chains of consecutive levels (workers)
    the graph holds, the frontier's width, which picks numpy rounds or a plain loop.
    """
    starts, succ, indeg = _successors(total, src, dst)
    if chains < NUMPY_LEVELS_MIN_CHAINS:
        return _levels_by_node(starts.tolist(), succ.tolist(), indeg.tolist())
    level = np.zeros(total, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    seen = 0
    depth = 0
    while frontier.size:
        seen += frontier.size
        level[frontier] = depth
        counts = starts[frontier + 1] - starts[frontier]
        reach = int(counts.sum())
        if reach == 0:
            break
        offsets = np.repeat(starts[frontier] - np.cumsum(counts) + counts, counts)
        reached = np.sort(succ[offsets + np.arange(reach)])
        # Distinct nodes reached and how many edges reach each (only this round's few, not a
        # bincount over all nodes per round).
        change = np.empty(reach, dtype=bool)
        change[0] = True
        np.not_equal(reached[1:], reached[:-1], out=change[1:])
        first = np.flatnonzero(change)
        nodes = reached[first]
        hits = np.empty_like(first)
        hits[:-1] = first[1:]
        hits[-1] = reach
        indeg[nodes] -= hits - first
        frontier = nodes[indeg[nodes] == 0]
        depth += 1
    if seen != total:
        raise ReplayError(_DEADLOCK)
    return level


_DEADLOCK = "op orders deadlock: a worker waits on an op ordered after its own"


def _successors(total: int, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, ...]:
    """Each node's successors as `succ[starts[v]:starts[v + 1]]` (edges in input order), and each
    node's in-degree."""
    order = np.argsort(src, kind="stable")
    return (np.searchsorted(src[order], np.arange(total + 1)), dst[order],
            np.bincount(dst, minlength=total))


def _levels_by_node(first_edge: list[int], successors: list[int], indeg: list[int]) -> np.ndarray:
    """`_levels` one node at a time (Kahn's queue, each node's depth raised by its predecessors'),
    on `_successors`' arrays as lists (`indeg` is used up)."""
    total = len(indeg)
    level = [0] * total
    queue = [v for v in range(total) if not indeg[v]]
    for v in queue:  # the queue grows as nodes are freed: Kahn's order
        deeper = level[v] + 1
        for w in successors[first_edge[v]:first_edge[v + 1]]:
            if level[w] < deeper:
                level[w] = deeper
            indeg[w] -= 1
            if not indeg[w]:
                queue.append(w)
    if len(queue) != total:
        raise ReplayError(_DEADLOCK)
    return np.array(level, dtype=np.int64)


def _run_iteration(g: _Graph, ready: np.ndarray, duration: np.ndarray) -> np.ndarray:
    """Earliest start of every node given each worker's ready time; returns end times."""
    if g.by_edge is not None:
        return _run_iteration_by_edge(g.by_edge, ready.tolist(), duration.tolist())
    end = np.zeros(duration.size)
    targets0 = g.sources
    fw = g.first_of_worker[targets0]
    end[targets0] = np.where(fw >= 0, ready[np.maximum(fw, 0)], 0.0) + duration[targets0]
    for targets, srcs, delays, offsets, firsts, slots in g.levels:
        best = np.maximum.reduceat(end[srcs] + delays, offsets)
        if firsts.size:
            best[firsts] = np.maximum(best[firsts], ready[slots])
        end[targets] = best + duration[targets]
    return end


def _run_iteration_by_edge(by_edge: tuple[list[int], list[int], list[int], list[float], list[int]],
                           ready: list[float], duration: list[float]) -> np.ndarray:
    """`_run_iteration` one edge at a time: a target's edges are consecutive and come after every
    edge into its predecessors (sorted by level), so each node's end is final before it is read.
    The same sums and maxima as the level-by-level evaluation, so the same floats."""
    sources, edge_src, edge_dst, edge_delay, first_of_worker = by_edge
    end = [0.0] * len(duration)
    for v in sources:
        worker = first_of_worker[v]
        end[v] = (ready[worker] if worker >= 0 else 0.0) + duration[v]
    target, best = -1, 0.0
    for u, v, d in zip(edge_src, edge_dst, edge_delay, strict=True):
        if v != target:
            if target >= 0:
                end[target] = best + duration[target]
            target = v
            worker = first_of_worker[v]
            best = ready[worker] if worker >= 0 else 0.0
        arrival = end[u] + d
        if arrival > best:
            best = arrival
    if target >= 0:
        end[target] = best + duration[target]
    return np.array(end)


@dataclass
class ReplayReport:
    iteration_ms: float
    iterations: int
    converged: bool
    busy_ms: dict[Worker, float]
    idle_ms: dict[Worker, float]
    iteration_end_ms: list[float]
    cycle: int = 0
    """Iterations per repetition of the settled steady state (1: every iteration alike, 2: lengths
    alternate, ...); 0 when the replay did not settle (then `converged` is False and
    `iteration_ms` is only an estimate: the mean over the second half of the replayed iterations)."""


def replay(
    job: JobSpec,
    ops: Sequence[Op],
    iterations: int = 40,
    jitter: float = 0.0,
    seed: int = 0,
) -> ReplayReport:
    """Replay the plan's op orders back to back and measure the steady-state period.

    With `jitter` > 0 every op of every iteration lasts its planned time times a uniform factor in
    [1 - jitter, 1 + jitter], and the period is the mean over all replayed iterations.
    """
    if not ops:
        raise ReplayError("plan has no ops")
    g = _build_graph(job, ops)
    rng = np.random.default_rng(seed) if jitter > 0 else None  # numpy.random loads only for jitter
    ready = np.zeros(len(g.workers))
    ends: list[float] = []
    increments: list[np.ndarray] = []
    converged = False
    cycle = 0
    prev_worker_end = np.zeros(len(g.workers))
    for i in range(iterations):
        duration = g.duration
        if jitter > 0:
            duration = duration * rng.uniform(1 - jitter, 1 + jitter, size=duration.size)
        end = _run_iteration(g, ready, duration)
        worker_end = end[g.last_of_worker]
        ends.append(float(worker_end.max()))
        increments.append(worker_end - prev_worker_end)
        prev_worker_end = worker_end
        ready = worker_end
        if jitter == 0 and i >= 2:
            cycle = settled_cycle(increments)
            if cycle:
                converged = True
                break
    if jitter > 0 or not converged:
        half = max(1, len(ends) // 2)
        period = (ends[-1] - ends[half - 1]) / (len(ends) - half) if len(ends) > half else ends[-1]
    else:
        # A steady state that repeats every `cycle` iterations (lengths alternating, say) has the
        # mean of those lengths as its period, not the last one.
        period = (ends[-1] - ends[-1 - cycle]) / cycle
    # Each worker's written busy time, summed in op order (np.bincount adds in index order).
    sums = np.bincount(g.slot, weights=g.span, minlength=len(g.workers)).tolist()
    busy = dict(zip(g.workers, sums, strict=True))
    idle = {w: max(0.0, period - b) for w, b in busy.items()}
    return ReplayReport(period, len(ends), converged or jitter > 0, dict(busy), idle, ends, cycle)


MAX_CYCLE = 4


def settled_cycle(increments: list[np.ndarray]) -> int:
    """The smallest c <= MAX_CYCLE such that every worker's advance over the last c iterations
    equals its advance over the c before, and all workers advance alike (the replay repeats every c
    iterations); 0 while it has not settled. `increments[i]` is each worker's end advance in i."""
    for c in range(1, MAX_CYCLE + 1):
        if len(increments) < 2 * c + 1:
            break
        last = np.sum(increments[-c:], axis=0)
        before = np.sum(increments[-2 * c:-c], axis=0)
        if np.allclose(last, before, atol=1e-7, rtol=0) and np.allclose(last, last.mean(), atol=1e-7, rtol=0):
            return c
    return 0
