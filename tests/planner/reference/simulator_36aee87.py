"""FROZEN reference: planner/simulator.py as of commit 36aee87, before the replay graph was built
from attribute columns and one lexsort. Kept only so tests/planner/test_fast_equivalence.py can
check that the faster replay gives identical reports; never imported by the planner, never edited."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from planner.precedence import BARRIER_SOURCE, INPUTS, needs
from planner.spec import JobSpec, Worker
from planner.timeline import Op, worker_orders


@dataclass
class _Graph:
    """The op DAG of one iteration, in level order, ready for vectorized evaluation."""

    ops: list[Op]
    duration: np.ndarray
    first_of_worker: np.ndarray  # op index -> worker slot, or -1 when not the worker's first op
    last_of_worker: np.ndarray  # worker slot -> index of its final op
    sources: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    """Level-0 nodes (no predecessor)."""
    levels: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=list)
    """Levels 1.. : (targets, edge sources, edge delays, reduceat offsets)."""
    workers: list[Worker] = field(default_factory=list)


class ReplayError(ValueError):
    """The op orders deadlock (a cycle through worker order and data dependencies)."""


_KIND_CODE = {"F": 0, "B": 1, "W": 2, "ALLREDUCE": 3, "OPTIMIZER": 4}


def _build_graph(job: JobSpec, ops: Sequence[Op]) -> _Graph:
    """Nodes are the ops (per worker, in order) plus one sync node per stage; edges carry delays.

    Built with array operations: a 100k-op plan has ~400k edges, too many for per-edge Python.
    """
    costs = job.costs
    S, DM = job.stages, job.pipelines * job.microbatches
    orders = worker_orders(ops)
    workers = sorted(orders)
    flat: list[Op] = [op for w in workers for op in orders[w]]
    n = len(flat)
    M = job.microbatches
    # One pass over the ops (attribute access dominates at 100k ops), then columns.
    table_rows = np.array(
        [(_KIND_CODE[op.kind], op.worker[0], op.worker[1],
          -1 if op.microbatch is None else op.microbatch[0] * M + op.microbatch[1])
         for op in flat], dtype=np.int64).reshape(n, 4)
    kind, pipe, stage, mb = (table_rows[:, c] for c in range(4))
    # Durations are the job's (rule 2), not the written end - start: the validator accepts written
    # times within 1e-6 ms, and a replay of shortened ops could come out below the proven bound.
    by_kind = np.array([[costs.duration(k, s) for s in range(S)] for k in _KIND_CODE], dtype=np.float64)
    duration_ops = by_kind[kind, stage] if n else np.zeros(0)
    slot = np.repeat(np.arange(len(workers)), [len(orders[w]) for w in workers])

    is_ar = kind == 3
    ar_stages = np.unique(stage[is_ar])
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
    level = _levels(total, src_a, dst_a)
    graph = _Graph(
        ops=flat,
        duration=duration,
        first_of_worker=first,
        last_of_worker=last,
        workers=workers,
    )
    order = np.lexsort((dst_a, level[dst_a]))
    src_a, dst_a, delay_a = src_a[order], dst_a[order], delay_a[order]
    edge_level = level[dst_a]
    bounds = np.searchsorted(edge_level, np.arange(level.max() + 2)) if total else np.zeros(1, int)
    for lv in range(1, int(level.max()) + 1 if total else 0):
        a, b = bounds[lv], bounds[lv + 1]
        targets, offsets = np.unique(dst_a[a:b], return_index=True)
        graph.levels.append((targets, src_a[a:b], delay_a[a:b], offsets))
    graph.sources = np.flatnonzero(level == 0)
    return graph


def _levels(total: int, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Longest-path depth of each node (Kahn's algorithm, one frontier per round); raises on a cycle.

    A node leaves the frontier in round r exactly when its deepest predecessor is at depth r - 1,
    so the round number is the level.
    """
    indeg = np.bincount(dst, minlength=total)
    order = np.argsort(src, kind="stable")
    starts = np.searchsorted(src[order], np.arange(total + 1))
    succ = dst[order]
    level = np.zeros(total, dtype=np.int64)
    frontier = np.flatnonzero(indeg == 0)
    seen = 0
    depth = 0
    while frontier.size:
        seen += frontier.size
        level[frontier] = depth
        counts = starts[frontier + 1] - starts[frontier]
        if counts.sum() == 0:
            break
        offsets = np.repeat(starts[frontier] - np.cumsum(counts) + counts, counts)
        reached = succ[offsets + np.arange(counts.sum())]
        indeg -= np.bincount(reached, minlength=total)
        candidates = np.unique(reached)
        frontier = candidates[indeg[candidates] == 0]
        depth += 1
    if seen != total:
        raise ReplayError("op orders deadlock: a worker waits on an op ordered after its own")
    return level


def _run_iteration(g: _Graph, ready: np.ndarray, duration: np.ndarray) -> np.ndarray:
    """Earliest start of every node given each worker's ready time; returns end times."""
    start = np.zeros(duration.size)
    firsts = g.first_of_worker
    end = np.zeros(duration.size)
    targets0 = g.sources
    fw = firsts[targets0]
    start[targets0] = np.where(fw >= 0, ready[np.maximum(fw, 0)], 0.0)
    end[targets0] = start[targets0] + duration[targets0]
    for targets, srcs, delays, offsets in g.levels:
        best = np.maximum.reduceat(end[srcs] + delays, offsets)
        fw = firsts[targets]
        best = np.maximum(best, np.where(fw >= 0, ready[np.maximum(fw, 0)], 0.0))
        start[targets] = best
        end[targets] = best + duration[targets]
    return end


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
    rng = np.random.default_rng(seed)
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
    busy: dict[Worker, float] = defaultdict(float)
    for op in g.ops:
        busy[op.worker] += op.end_ms - op.start_ms
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
