"""Local search over each worker's F/B order, re-timed by the sweep and replayed.

The contract's period depends only on the workers' op orders, and the constructive schedulers
(greedy at every worker) and CP-SAT within a short budget both leave orders whose neighbours are
faster: on the made-up 1 x 5 x 10 whose stage 0 holds three micro-batches (docs/notes/
planner-issue8.md, P and R) the best list schedule is 262.4 ms and CP-SAT's deterministic step
from it 262.3, while swapping adjacent ops of one worker reaches CP-SAT's proven optimum 255.6 in
~600 swaps (1.4 s), where CP-SAT itself needed 90 s to find and prove it. A swap decides, at one
worker, which of two ready round trips goes first: exactly the choice that decides whether
micro-batches travel as a burst or a cadence apart.

The search: a seeded random worker, a random adjacent pair in its F/B order of different kinds
and different micro-batches, swapped; the sweep (`planner.sweep.sweep_schedule`) re-places every W
given the new F/B orders (with the W overrun of `OVERRUNS` that suits the start) and returns None when
the orders deadlock or a warm-up does not fit in memory, so every schedule it yields is valid; the
replay measures the period. A swap is kept when the period is no worse (equal periods let the
search walk a plateau). Deterministic for a seed and an evaluation cap; it stops at the cap, at the
bound or at an optional deadline.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from planner.routing import balanced_routing
from planner.simulator import ReplayError, replay
from planner.spec import JobSpec, Worker
from planner.sweep import SweepPolicy, sweep_schedule
from planner.timeline import Key, Op, Orders, orders_of

OVERRUNS = (0.0, 0.5, 1.0)
"""W overruns (`SweepPolicy.w_overrun`) the start's orders are re-timed with; the search then
re-times every swap with the one that suited the start (one sweep and replay per swap: 600 swaps
in 0.9-1.4 s instead of 3-4 s on the 1 x 5 x 10, both reaching 255.6; a made-up 1 x 8 x 14 from
376.68: 371.36 with all three per swap, 371.58 with the start's, seed 0)."""


@dataclass(frozen=True)
class OrderSearchResult:
    ops: list[Op]
    period_ms: float
    evaluations: int
    """Swaps evaluated (each is one sweep and one replay)."""
    accepted: int
    """Swaps kept (sideways ones included)."""


def search_orders(
    job: JobSpec,
    failed: tuple[Worker, ...],
    ops: list[Op],
    period_ms: float,
    bound_ms: float,
    max_evaluations: int,
    seed: int = 0,
    deadline: float | None = None,
) -> OrderSearchResult | None:
    """A schedule with a strictly shorter replayed period than `period_ms`, found by adjacent swaps
    from `ops`' orders, or None. `deadline` is a `time.perf_counter()` value."""
    if period_ms <= bound_ms + 1e-6:
        return None  # nothing valid is shorter
    # With its orders given the sweep reads only the routing's failed set (who is dead).
    routing = balanced_routing(job, failed)
    orders: Orders = {w: [key for key in seq if key[0] != "W"] for w, seq in orders_of(ops).items()}
    best = _retimed(job, routing, orders, OVERRUNS)
    if best is None:
        return None
    overrun = (best[2],)  # the search re-times with the overrun that suits the start (4x cheaper)
    walk = best[0]  # the current orders' period (the start's re-timing may be above `period_ms`)
    current, best_ops = (best[0], best[1]) if best[0] < period_ms - 1e-9 else (period_ms, None)
    rng = random.Random(seed)
    workers = sorted(w for w, seq in orders.items() if _swappable(seq))
    evaluations = accepted = 0
    while workers and evaluations < max_evaluations and current > bound_ms + 1e-6:
        if deadline is not None and time.perf_counter() > deadline:
            break
        worker = workers[rng.randrange(len(workers))]
        seq = orders[worker]
        i = rng.randrange(len(seq) - 1)
        if not _may_swap(seq[i], seq[i + 1]):
            continue
        trial = list(seq)
        trial[i], trial[i + 1] = seq[i + 1], seq[i]
        candidate = {**orders, worker: trial}
        evaluations += 1
        found = _retimed(job, routing, candidate, overrun)
        if found is None or found[0] > walk + 1e-9:
            continue
        accepted += 1
        orders, walk = candidate, found[0]
        if walk < current - 1e-9:
            current, best_ops = walk, found[1]
    if best_ops is None:
        return None
    return OrderSearchResult(best_ops, current, evaluations, accepted)


def _may_swap(a: Key, b: Key) -> bool:
    """Two adjacent ops of one worker whose order may be exchanged: different kinds (two F's or two
    B's keep their order, which routing and the sweep's warm-up rely on) and different micro-batches
    (a micro-batch's F precedes its B)."""
    return a[0] != b[0] and a[1:3] != b[1:3]


def _swappable(seq: list[Key]) -> bool:
    return any(_may_swap(a, b) for a, b in zip(seq, seq[1:], strict=False))


def _retimed(job: JobSpec, routing, orders: Orders,
             overruns: tuple[float, ...]) -> tuple[float, list[Op], float] | None:
    """The best settled replay of `orders` re-timed by the sweep over `overruns`, with its ops and
    overrun; None when the orders deadlock, do not fit in memory or never settle."""
    best = None
    for overrun in overruns:
        ops = sweep_schedule(job, routing, SweepPolicy(w_overrun=overrun), orders)
        if ops is None:
            return None  # a deadlock is the F/B orders'; a memory stall under one overrun is
            # rejected too (conservative: another overrun's W's might have made room)
        try:
            report = replay(job, ops)
        except ReplayError:
            continue
        if report.converged and (best is None or report.iteration_ms < best[0] - 1e-9):
            best = (report.iteration_ms, ops, overrun)
    return best
