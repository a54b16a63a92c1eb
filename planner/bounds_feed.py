"""Bound 10 (docs/notes/bounds.md, section 11): a stage short of memory above starves the fill below.

Bound 1 lets a stage-t worker run up to k_t forwards (its own memory) before its first B. Each of
those micro-batches also holds memory at every stage u above t until its B there ends, and no B of
the iteration ends at stage u before one has run at stage t and come back. So until then all of
stage t's workers together can start at most cap_u = alive_u x k_u forwards: where that is fewer
than they need to cover their fills, some of them wait longer, and stage t's span grows.

With s_w the first op of stage-t worker w, b_w the start of its first B, s and b the least of them
over the stage, and c = F_t + B_t + W_t:
- b_w >= s_w + F_t + chain_t (bound 1), so b >= s + F_t + chain_t.
- The first B to end at stage u ends at >= b + back_u, back_u = B_t + sum_{u<=v<t}(hop_v + B_v);
  before that every stage-u worker holds what it has started (a_u each), so at most cap_u
  micro-batches start their F at stage u. One that starts its F at stage t before E = b + back_u +
  sum_{u<=v<t}(F_v + hop_v) started it at stage u before b + back_u: at most cap_u of them.
- In [s_w, min(b_w, E)) w runs only forwards (no B yet, no W without a B), all of them from those
  cap_u: k_w of them, so it idles >= min(b_w, E) - s_w - k_w F_t there.
- Stage t all-reduces after its last worker and every worker starts the next iteration after the
  optimizer, so P >= (s_w - s) + n_w c + idle_w + AR_t + OPT_t for every w. With min(b_w, E) - s
  >= F_t + chain_t: P >= n_w c + AR_t + OPT_t + fill(k_w) + drain(n_w), fill(k) = max(0, F_t +
  chain_t - k F_t) and drain bound 1's idle after the last F. When n_w = k_w the two windows may
  overlap and only the larger counts; otherwise w's last F starts at or after min(b_w, E) (every
  F before that is one of the k_w) and its drain window follows it.
- k_w <= min(k_t, n_w), sum_w k_w <= cap_u, sum_w n_w = D x M: P is at least the least value for
  which some choice covers the stage (bisection; the split of the cap_u forwards is a small
  knapsack over the stage's like workers).
"""

from __future__ import annotations

import math
from functools import cache

from planner.bounds import (
    Bound,
    alive_per_stage,
    bisect_covering,
    chain_below,
    drain_idle,
    holds,
    stage_hops,
    worker_span,
)
from planner.spec import JobSpec, StageCosts, Worker

EXACT_SPLIT_MAX_STEPS = 100_000
"""The split of the forwards between workers is solved exactly (a knapsack over like workers, in
the micro-batches still missing) up to this many steps; above it a relaxation that only caps how
many workers reach each level (still a bound, weaker): a stage of 1024 workers fed by a short one
would otherwise take seconds."""


def fed_fill_bound(job: JobSpec, failed: tuple[Worker, ...] | list[Worker], floor_ms: float = 0.0) -> Bound:
    """Bound 10 over every stage t fed by a stage above it with fewer slots than its fill needs;
    stages where it cannot exceed `floor_ms` (a bound already known) are not worked out."""
    costs = job.costs
    S, total = job.stages, job.pipelines * job.microbatches
    alive = alive_per_stage(job, failed)
    if min(alive) == 0:
        return Bound(0.0, "")  # a stage without survivors: no plan at all
    hop = stage_hops(costs, S)
    best = Bound(0.0, "")
    pool, narrow = math.inf, -1  # the fewest micro-batches a stage above t holds before a B ends
    for t in range(1, S):
        slots_above = alive[t - 1] * holds(costs, t - 1, total)
        if slots_above < pool:
            pool, narrow = slots_above, t - 1
        value = _stage_bound(costs, t, alive[t], int(pool), total, chain_below(costs, hop, t),
                             max(floor_ms, best.value_ms))
        if value > best.value_ms:
            workers = f"{alive[t]} workers" if alive[t] > 1 else "one worker"
            best = Bound(value, f"the fill at stage {t} fed by stage {narrow}: {int(pool)} micro-batches "
                                f"reach stage {t}'s {workers} before a B frees one")
    return best


def _stage_bound(costs: StageCosts, t: int, workers: int, pool: int, total: int, chain: float,
                 floor_ms: float) -> float:
    f = costs.forward[t]
    own = holds(costs, t, total)
    if f <= 0:
        return 0.0
    enough = min(own, max(0, math.ceil((f + chain) / f - 1e-12)))  # forwards that leave no fill idle
    if pool >= workers * enough:
        return 0.0  # bound 1 already gives every worker its own k_t

    @cache
    def drain(n: int) -> float:
        return drain_idle(costs, t, n, own, chain)

    def span(n: int, k: int) -> float:
        return worker_span(costs, t, n, k, chain, drain(n))

    def most_served(period: float, k: int) -> int:
        # span(n, k) grows with n (each micro-batch adds c and takes at most B + W off the drain).
        lo, hi = 0, total
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if span(mid, k) <= period:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def covers(period: float) -> bool:
        return _covered([most_served(period, k) for k in range(enough + 1)], workers, pool, total)

    low = max(floor_ms, span(-(-total // workers), enough))  # bound 1's value with the fill covered
    high = span(total, 0)
    if low >= high or covers(low):
        return 0.0
    low, high = bisect_covering(covers, low, high)
    # The least covering period is some worker's span(n, k), so it is the least of those in
    # (low, high] that covers: the value itself, not the bisection's approximation of it.
    inside = set()
    for k in range(enough + 1):
        n = most_served(high, k)
        while n > 0 and span(n, k) > low:
            inside.add(span(n, k))
            n -= 1
    return min((value for value in inside if covers(value)), default=low)


def _covered(served: list[int], workers: int, pool: int, total: int) -> bool:
    """Whether `workers` like workers can serve `total` micro-batches when a worker given k of the
    shared `pool` forwards serves at most served[k] (non-decreasing in k)."""
    base = workers * served[0]
    if base >= total:
        return True
    need = total - base
    # Only the levels where served grows matter: (forwards needed, micro-batches gained).
    levels = [(k, served[k] - served[0]) for k in range(1, len(served)) if served[k] > served[k - 1]]
    if not levels or workers * levels[-1][1] < need:
        return False
    # Relaxation (an upper bound on what any split gains): at most pool // k workers reach a level
    # needing k forwards.
    gained, below = 0, 0
    for k, gain in levels:
        gained += min(workers, pool // k) * (gain - below)
        below = gain
    if gained < need:
        return False
    # An even split (a lower bound): every worker floor(pool / workers) forwards, the rest one more.
    even, extra = divmod(pool, workers)
    top = len(served) - 1
    if (workers - extra) * served[min(even, top)] + extra * served[min(even + 1, top)] >= total:
        return True
    if workers * (need + 1) * len(levels) > EXACT_SPLIT_MAX_STEPS:
        return True  # undecided and too large to solve: claim nothing (the bound stays sound)
    # fewest[v]: the least pool that gains v more micro-batches (v capped at need) so far.
    fewest = [0] + [math.inf] * need
    for _ in range(workers):
        fewest = [min([fewest[v]] + [fewest[max(0, v - gain)] + k for k, gain in levels])
                  for v in range(need + 1)]
    return fewest[need] <= pool
