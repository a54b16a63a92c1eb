"""Zero-Bubble-style constructive schedule: fixed 1F1B F/B orders, W's placed with exact gap knowledge.

An event-driven list scheduler decides whether to start a W before it knows when the next input
arrives, and a W started just before a gradient lands delays that gradient's whole chain back to
stage 0. Zero Bubble's own heuristic avoids that by fixing each stage's F/B order first (warm-up
forwards, then one B and one F in turn, micro-batches in index order) and computing times in a
dependency sweep: when an op is placed, its input's arrival is already known, so the W's that fit in
the gap before it are inserted exactly, and a W is forced in only to free memory. This module is that
idea generalised to D pipelines with re-routed micro-batches: a worker's micro-batches (its own and
those re-routed to it) are ordered by (index, home pipeline), the warm-up depth is a knob, and a
sweep that cannot complete (inconsistent orders) is reported as None so callers fall back.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from operator import itemgetter

import numpy as np

from planner.heuristic import collectives
from planner.precedence import needs
from planner.routing import Routing
from planner.simulator import ReplayError, _levels
from planner.spec import JobSpec, Worker
from planner.timeline import Key, Op, Orders

_EPS = 1e-9


@dataclass(frozen=True, slots=True)
class SweepPolicy:
    warmup_slack: int = 0
    """A stage-s worker runs `S - s + warmup_slack` forwards (memory permitting) before its first B."""
    w_overrun: float = 0.0
    """A W may also start when it overruns the next input's arrival by at most this fraction of
    W's duration (0: only W's that fit entirely in the gap)."""
    routing_rotation: int = 0
    fused_backward: bool = False
    """Run each W right after its B: classic 1F1B with an unsplit backward, as DeepSpeed-style
    engines do (used to model baselines built on them, not by the planner itself)."""

    @property
    def name(self) -> str:
        fused = ",fused" if self.fused_backward else ""
        return (f"sweep(warmup=S-s+{self.warmup_slack},overrun={self.w_overrun:g},"
                f"rot={self.routing_rotation}{fused})")


def _worker_orders(job: JobSpec, routing: Routing, policy: SweepPolicy) -> Orders:
    """Each alive worker's F/B sequence: warm-up forwards, then B and F in turn, then the last B's."""
    D, S, M = job.pipelines, job.stages, job.microbatches
    costs = job.costs
    mbs: dict[Worker, list[tuple[int, int]]] = {}
    for home in range(D):
        for m in range(M):
            for s in range(S):
                q = routing.executor(home, m, s)
                mbs.setdefault((q, s), []).append((m, home))
    # Warm-up depth per stage, non-increasing down the pipeline: a stage that waited for more
    # forwards than its predecessor sends before its own first B would deadlock (Zero Bubble's
    # "stage i runs at least as many F's as stage i+1").
    depth = []
    for s in range(S):
        fits = min(costs.fits(s, D * M), *(depth[-1:] or [D * M]))
        depth.append(max(1, min(fits, S - s + policy.warmup_slack)))
    orders: Orders = {}
    for w, items in mbs.items():
        s = w[1]
        items.sort()
        ids = [(home, m) for m, home in items]
        warmup = min(len(ids), depth[s])
        seq: list[Key] = [("F", *mb, s) for mb in ids[:warmup]]
        for j, mb in enumerate(ids):
            seq.append(("B", *mb, s))
            if warmup + j < len(ids):
                seq.append(("F", *ids[warmup + j], s))
        orders[w] = seq
    return orders


def insertion_orders(job: JobSpec, routing: Routing, template: list[Op],
                     last_stage_pairs: bool = False) -> Orders:
    """Fault-free orders for every alive worker, with each re-routed micro-batch inserted on its peer.

    `template` is a one-pipeline fault-free schedule (pipeline 0's ops). Every alive worker keeps that
    stage's F/B order for its own micro-batches; a re-routed micro-batch (p, m) goes right after the
    peer's own op of index m, where its input arrives (all pipelines run the same template, so p's
    neighbours send it when the peer's own pipeline sends index m). The rest of the job keeps its
    optimal rhythm; only the peers absorb the extra work.

    `last_stage_pairs`: at the last stage a micro-batch's B follows its F at once, so the peer's own F
    and B of index m are adjacent, and a moved F inserted between them holds the peer's own B (and
    its whole pipeline's gradients) behind a forward that arrives a cross-pipeline hop later. With
    this set a micro-batch moved at the last stage runs its F and B together right after the peer's
    own B of index m instead (made-up 8 x 3 x 20 with (5, 2) dead, every stage holding two
    micro-batches: inserted 430.7 -> 390.4 ms against the 10 s plan's 392.3; docs/notes/
    planner-issue8.md, AV). The ReCycle paper's construction (`planner.paper_style`) keeps the
    default.
    """
    S, D = job.stages, job.pipelines
    stage_order: dict[int, list[tuple[str, int]]] = {}
    for op in sorted(template, key=lambda o: o.start_ms):
        if op.kind in ("F", "B") and op.worker[0] == 0:
            stage_order.setdefault(op.worker[1], []).append((op.kind, op.microbatch[1]))
    moved: dict[tuple[int, int, str, int], list[tuple[str, int]]] = {}  # (peer, stage, kind, m) -> ops
    for (home, m, s), q in sorted(routing.moved.items()):
        if last_stage_pairs and s == S - 1:
            moved.setdefault((q, s, "B", m), []).extend((("F", home), ("B", home)))
            continue
        for kind in ("F", "B"):
            moved.setdefault((q, s, kind, m), []).append((kind, home))
    dead = set(routing.failed)
    receiving = {(q, s) for q, s, _, _ in moved}
    orders: Orders = {}
    for q in range(D):
        for s in range(S):
            if (q, s) in dead:
                continue
            if (q, s) not in receiving:  # only its own micro-batches: the template's order as is
                orders[(q, s)] = [(kind, q, m, s) for kind, m in stage_order.get(s, [])]
                continue
            seq: list[Key] = []
            for kind, m in stage_order.get(s, []):
                seq.append((kind, q, m, s))
                seq.extend((extra, home, m, s) for extra, home in moved.get((q, s, kind, m), ()))
            orders[(q, s)] = seq
    return orders


STALL_CHECK_AFTER = 1024
"""`sweep_schedule` asks `_stalls` once this many F/B ops are placed: sweeps that end sooner (small
jobs, a warm-up that does not fit in memory) never pay for the check."""


def _stalls(orders: dict[int, list[tuple[str, int]]], S: int, DM: int, rule3) -> bool:
    """Whether `sweep_schedule`'s loop would stall before placing every F/B of `orders` (worker
    index -> its (kind, micro-batch) sequence): some op's input is in no order, or the worker
    orders and rule 3's edges form a cycle. Checked on arrays (the loop gets ~15% through a
    32 x 16 x 64 mix in ~0.1 s before it stalls). Both only make the sweep return None, which the
    loop would then also do (or earlier, for memory), so the result is the same either way.
    Orders holding one op twice are left to the loop (False)."""
    lens = [len(seq) for seq in orders.values()]
    total = sum(lens)
    if not total:
        return False
    flat = [entry for seq in orders.values() for entry in seq]
    is_b = np.fromiter(map(_is_b, flat), np.int64, total)
    mb = np.fromiter(map(_mb_of, flat), np.int64, total)
    worker = np.repeat(np.fromiter(orders, np.int64, len(orders)), lens)
    stage = worker % S
    key = (is_b * DM + mb) * S + stage
    entry_of = np.full(2 * DM * S, -1, dtype=np.int64)
    entry_of[key] = np.arange(total)
    if np.count_nonzero(entry_of >= 0) != total:
        return False  # a key twice: not the case this check is exact for
    # Each op's input per (is B, stage): the source's (is B, stage), or stage -1 for none.
    src_b = np.zeros((2, S), dtype=np.int64)
    src_stage = np.full((2, S), -1, dtype=np.int64)
    for b, kind in enumerate(("F", "B")):
        for s in range(S):
            need = rule3.get((kind, s))
            if need is not None:
                src_b[b, s], src_stage[b, s] = need.source == "B", need.source_stage
    has_input = src_stage[is_b, stage] >= 0
    dst = np.flatnonzero(has_input)
    src = entry_of[(src_b[is_b[dst], stage[dst]] * DM + mb[dst]) * S + src_stage[is_b[dst], stage[dst]]]
    if (src < 0).any():
        return True  # an input no worker runs: its consumer waits forever
    chain = np.flatnonzero(worker[1:] == worker[:-1])
    try:
        _levels(total, np.concatenate([src, chain]), np.concatenate([dst, chain + 1]), len(orders))
    except ReplayError:
        return True
    return False


def _is_b(entry: tuple[str, int]) -> bool:
    return entry[0] == "B"


_mb_of = itemgetter(1)


def sweep_schedule(
    job: JobSpec,
    routing: Routing,
    policy: SweepPolicy = SweepPolicy(),
    orders: Orders | None = None,
) -> list[Op] | None:
    """A valid schedule, or None when the fixed orders deadlock (a cycle across workers).

    `orders` (e.g. `timeline.orders_of` of a schedule) replaces the 1F1B orders, e.g. to keep a list
    schedule's F/B sequence and only re-place its W's with exact gap knowledge.
    """
    costs = job.costs
    D, S, M = job.pipelines, job.stages, job.microbatches
    fwd, bwd, wgt, act = costs.forward, costs.backward_input, costs.backward_weight, costs.activation
    act_w = costs.activation_w  # rule 6: held from B end to W end (act - act_w is freed at B end)
    limit = costs.memory_limit_mb + 1e-9
    dead = set(routing.failed)
    given = orders if orders is not None else _worker_orders(job, routing, policy)
    # Fast layout for the loop below: worker index wi = p * S + s, micro-batch mb = home * M + m;
    # W's in the given orders are dropped (they are re-placed here).
    orders = {p * S + s: [(k, home * M + m) for k, home, m, _ in seq if k != "W"]
              for (p, s), seq in given.items()}
    rule3 = needs(costs, S)
    pos = dict.fromkeys(orders, 0)
    end_at: dict[tuple[str, int, int], float] = {}  # (kind, mb, stage) -> end time
    where: dict[tuple[int, int], int] = {}  # (mb, stage) -> worker index
    for wi, seq in orders.items():
        for _, mb in seq:
            where[(mb, wi % S)] = wi
    free = dict.fromkeys(orders, 0.0)
    mem = dict.fromkeys(orders, 0.0)
    pending_w: dict[int, deque] = {wi: deque() for wi in orders}
    ops: list[Op] = []
    overrun = policy.w_overrun
    # What an F or B at stage s waits for, from the one precedence graph (planner/precedence.py):
    # (source kind, source stage, same-pipeline delay, cross-pipeline delay), or None.
    need_f, need_b = ([None if (k, s) not in rule3 else
                       (rule3[(k, s)].source, rule3[(k, s)].source_stage, rule3[(k, s)].same_ms,
                        rule3[(k, s)].cross_ms) for s in range(S)] for k in ("F", "B"))
    # One worker tuple per worker and one micro-batch tuple per micro-batch, shared by the ops.
    worker_of = {wi: (wi // S, wi % S) for wi in orders}
    mb_of = [divmod(mb, M) for mb in range(D * M)]

    def run_w(wi: int) -> None:
        mb = pending_w[wi].popleft()
        s = wi % S
        start = free[wi]
        free[wi] = start + wgt[s]
        mem[wi] -= act_w[s]
        ops.append(Op(worker_of[wi], "W", mb_of[mb], start, free[wi]))

    ready = deque(orders)
    waiting: dict[tuple[str, int, int], list[int]] = {}
    placed = 0
    total = sum(len(seq) for seq in orders.values())
    while ready:
        wi = ready.popleft()
        seq = orders[wi]
        while pos[wi] < len(seq):
            kind, mb = seq[pos[wi]]
            s = wi % S
            need = (need_f if kind == "F" else need_b)[s]
            if need is None:
                at = 0.0  # F on stage 0: its input is there from the start
            else:
                source, source_stage, same_ms, cross_ms = need
                dep = (source, mb, source_stage)
                src = end_at.get(dep)
                if src is None:  # not placed yet: resume this worker when it is
                    waiting.setdefault(dep, []).append(wi)
                    break
                at = src + (cross_ms if where[(mb, source_stage)] // S != wi // S else same_ms)
            if kind == "F":
                while mem[wi] + act[s] > limit:
                    if not pending_w[wi]:
                        return None  # the warm-up does not fit in memory
                    run_w(wi)
            # Fill the gap before this op's input with W's that fit (or overrun by the allowance).
            while pending_w[wi] and free[wi] + wgt[s] <= at + overrun * wgt[s] + _EPS:
                run_w(wi)
            start = max(free[wi], at)
            dur = fwd[s] if kind == "F" else bwd[s]
            free[wi] = start + dur
            if kind == "F":
                mem[wi] += act[s]
            else:
                mem[wi] -= act[s] - act_w[s]
                pending_w[wi].append(mb)
            end_at[(kind, mb, s)] = free[wi]
            ops.append(Op(worker_of[wi], kind, mb_of[mb], start, free[wi]))
            if kind == "B" and policy.fused_backward:
                run_w(wi)
            placed += 1
            if placed == STALL_CHECK_AFTER and _stalls(orders, S, D * M, rule3):
                return None  # the loop would stall further on (placed != total): None either way
            pos[wi] += 1
            for other in waiting.pop((kind, mb, s), ()):
                ready.append(other)
    if placed != total:
        return None
    stage_done = [0.0] * S
    for wi in orders:
        while pending_w[wi]:
            run_w(wi)
        stage_done[wi % S] = max(stage_done[wi % S], free[wi])
    for s in range(S):
        if any((p, s) not in dead for p in range(D)):
            ops.extend(collectives(job, s, dead, stage_done[s]))
    return ops
