"""Stage 0's tail run without idling: a polish every plan may take.

After a stage-0 worker's last forward, its remaining B's feed no other worker (stage 0 has nothing
upstream) and its W's feed only the stage's ALLREDUCE, so what matters there is only when the worker
finishes: one machine, ops released when their gradient arrives (B) or their B ends (W), makespan to
minimise. A non-delay order, which never idles while some op is ready, minimises it: the last idle
stretch ends at some B's arrival r, and every op still undone then (the B's arriving at or after r
and the W's behind them) has to run after r on any order. Memory cannot rise there either: with no
forward left, no micro-batch is added and each one's share only shrinks (rule 6).

The constructive schedulers leave such idle stretches where their W rule keeps a W out of a gap it
would overrun: on gpt-1.5b 8 x 8 x 24 with (7, 1), (7, 2), (7, 3) dead, the best constructed
schedule's stage-0 worker of pipeline 7 waits 2.2 ms for its last B with two W's pending
(1499.5 ms; 1497.3 with the W run first, which the paper-style planner's CP-SAT found in 4-8 s).

The releases are read from the plan's own times; the re-ordered plan is re-timed exactly
(`planner.cp.orders.retime`: valid by construction) and callers keep it only when its replayed
period is strictly shorter (the replay's steady state can release B's at other moments).
"""

from __future__ import annotations

import heapq

from planner.cp.orders import retime
from planner.precedence import needs
from planner.spec import JobSpec
from planner.timeline import Key, Op, Orders, orders_of


def first_stage_tail(job: JobSpec, ops: list[Op]) -> list[Op] | None:
    """`ops` with every stage-0 worker's ops after its last F re-ordered non-delay, B before W
    where both are ready; None when no order changes."""
    orders = orders_of(ops)
    timed = {(o.kind, *o.microbatch, o.worker[1]): o for o in ops if o.microbatch is not None}
    need = needs(job.costs, job.stages)[("B", 0)]
    changed: Orders = {}
    for worker, seq in orders.items():
        if worker[1] != 0:
            continue
        last_f = max((i for i, key in enumerate(seq) if key[0] == "F"), default=-1)
        if last_f < 0:
            continue
        released: dict[Key, float] = {}
        for key in seq[last_f + 1:]:
            if key[0] == "B":
                source = timed[(need.source, key[1], key[2], need.source_stage)]
                released[key] = source.end_ms + need.delay(source.worker[0], worker[0])
        tail = _non_delay(job, seq[last_f + 1:], released, timed[seq[last_f]].end_ms,
                          {key[1:3] for key in seq[:last_f + 1] if key[0] == "B"})
        if tail != seq[last_f + 1:]:
            changed[worker] = seq[:last_f + 1] + tail
    if not changed:
        return None
    return retime(job, {**orders, **changed}).ops


def _non_delay(job: JobSpec, tail: list[Key], released: dict[Key, float], free_ms: float,
               done: set[tuple[int, int]]) -> list[Key]:
    """One worker's `tail` in non-delay order from `free_ms`: the earliest-released ready B, else
    the first (in `tail`'s order) ready W (ready once its micro-batch's B is in `done` or placed),
    else wait. Heaps, not scans: a tail can hold every micro-batch of the worker."""
    b_heap = [(released[key], i, key) for i, key in enumerate(tail) if key[0] == "B"]
    heapq.heapify(b_heap)
    w_of = {key[1:3]: (i, key) for i, key in enumerate(tail) if key[0] == "W"}
    w_ready = [entry for mb, entry in w_of.items() if mb in done]
    heapq.heapify(w_ready)
    out: list[Key] = []
    now = free_ms
    while b_heap or w_ready:
        if b_heap and b_heap[0][0] <= now + 1e-9:
            key = heapq.heappop(b_heap)[2]
            if key[1:3] in w_of:
                heapq.heappush(w_ready, w_of[key[1:3]])
        elif w_ready:
            key = heapq.heappop(w_ready)[1]
        else:
            now = b_heap[0][0]
            continue
        out.append(key)
        now += job.costs.duration(key[0], key[3])
    return out
