"""Bound 4 (docs/notes/bounds.md, section 4): the stage's micro-batches shared among unequal workers.

The bounds of `planner.bounds` price the busiest worker of a stage, ceil(D x M / alive) micro-batches,
as if every worker of the stage were alike. They are not when a failure cuts a pipeline below a
worker: an alive worker (p, s) whose (p, s + 1) is dead sends every micro-batch it serves to another
pipeline's stage s + 1 and gets its B back from there, so each of its round trips carries two
cross-pipeline hops. When memory allows few micro-batches in flight, a round trip is a worker's time
per micro-batch, so the cut workers can serve fewer micro-batches in a period than the others and the
rest must carry more: the even split the busiest-worker bound assumes is then out of reach.

For a worker serving n micro-batches of stage s, each of the following is a lower bound on the period
(tail = AR_s + OPT_s; chain = sum_{t>s}(F_t + B_t) + the hops there and back, with the worker's own
first hop at least its kind's; k = how many it can hold between F start and B end; L = memory limit):
- work: n (F + B + W) + tail, plus bound 1's fill and drain idle with this worker's chain (a cut
  worker's first gradient and its last come back over two cross-pipeline hops);
- round trips, at most k at once: n (F + chain + B) / min(k, n) + W + tail (bound 3's stretch);
- memory-time: n (a (F + chain + B) + aw W) / L + tail;
- one at a time: when k = 1 and a + aw > L, no micro-batch's F can start while another's W is still
  pending, so the windows [F start, W end] are disjoint: n (F + chain + B + W) + tail;
- windows: every micro-batch holds at least aw MB over [F start, W end] (a until B end, then aw),
  so at most floor(L / aw) such windows are open at once: n (F + chain + B + W) / min(that, n) + tail;
- paced: bound 6's recurrence (docs/notes/bounds.md section 7) with this worker's chain, its last W
  end + tail; a cut worker's round trips are that much longer at every slot, not only on average
  (the largest over m <= n: the first m micro-batches obey the recurrence for m).
Each is non-decreasing in n, so with g_i(n) the largest for worker i, the period P must let the
workers' counts N_i(P) = max{n : g_i(n) <= P} cover the stage: sum_i N_i(P) >= D x M. The least such
P is the (D x M)-th smallest value among all g_i(n), found by binary search (workers of one kind
share g, so only the two kinds are searched).

Priced trips. A worker (p, s) whose pipeline is alive below it still cannot send every micro-batch
down its own pipeline: (p, s + 1) serves at most c(P) = max{n : g_next(n) <= P} micro-batches in a
period P (g_next: the terms above for a stage-(s + 1) worker on its own pipeline's chain), and each
round trip of (p, s) served elsewhere crosses pipelines at the s / s + 1 hop both ways, `extra` =
2 (min(cross_s, cross_{s+1}) - hop_s) longer. With `own` of its n round trips at the own chain and
n - own at chain + extra, the round-trip, memory-time, one-at-a-time and window terms each grow by
what the longer windows add: g(n, own). The least P is min over c of max(g_next(c), Q(c)), Q(c) the
least covering period when every such worker's own trips are capped at c: g_next grows with c and
Q shrinks, so a binary search on c finds it (docs/notes/bounds.md section 4, "Priced trips").
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

from planner.bounds import (
    MEMORY_TOLERANCE_MB,
    Bound,
    chain_below,
    forced_idle,
    holds,
    paced_w_ends,
    pending_w_cap,
    stage_hops,
)
from planner.spec import JobSpec, StageCosts, Worker

Kinds = list[tuple[int, Callable[[int], float]]]
"""(how many workers, g of one of them) per kind of worker at a stage, the cut kind first."""


@lru_cache(maxsize=1024)  # a job's failure sets, and the priced trips, ask for the same workers' g
def per_worker_bound(costs: StageCosts, s: int, chain: float, total: int,
                     extra: float = 0.0) -> Callable[..., float]:
    """g(n): the least period that lets one stage-s worker with round-trip `chain` serve n.
    g(n, own): the same when at most `own` of its round trips take `chain` and every other one
    takes `extra` longer (the priced trips of the module docstring)."""
    f, b, w = costs.forward[s], costs.backward_input[s], costs.backward_weight[s]
    a, aw = costs.activation[s], costs.activation_w[s]
    tail = costs.allreduce[s] + costs.optimizer[s]
    limit = costs.memory_limit_mb + MEMORY_TOLERANCE_MB
    k = max(1, holds(costs, s, total))
    one_at_a_time = k == 1 and a + aw > limit
    windows = max(1, pending_w_cap(costs, s, 0, total))  # [F start, W end] windows open at once
    # Bound 1's idle with this kind's chain grows the work term by at least min(F, B + W) per
    # micro-batch (the fill shrinks by at most F, the drain by at most B + W), so g stays increasing
    # by far more than a rounding error; with durations that small it is left out.
    with_idle = min(f, b + w) > 1e-9

    known: dict[tuple[int, int], float] = {}  # the searches ask for the same n many times
    works = _work_terms(costs, s, chain, total)  # the costly term; the pricing leaves it alone
    paced = _paced_terms(costs, s, chain, total)

    def g(n: int, own: int | None = None) -> float:
        crossed = 0 if own is None else max(0, n - own)
        if (n, crossed) not in known:
            known[(n, crossed)] = _g(n, crossed)
        return known[(n, crossed)]

    def _g(n: int, crossed: int) -> float:
        if n <= 0:
            return tail
        # n / min(k, n) is exactly 1.0 up to k, so g never dips by a rounding error between n and
        # n + 1 (n x r / n can be one ulp below r, and `most_served` relies on g being non-decreasing).
        if n not in works:
            works[n] = n * (f + b + w) + (forced_idle(costs, s, n, k, chain) if with_idle else 0.0)
        work = works[n]
        longer = crossed * extra  # what the crossing round trips add to the windows' sum
        # extra x (crossed / m), not longer / m: n x extra / n can be one ulp below (n - 1) x
        # extra / (n - 1), and g must not dip (the quotient itself is monotone in n).
        value = max(work, (f + chain + b) * (n / min(k, n)) + extra * (crossed / min(k, n)) + w)
        if limit > 0:
            value = max(value, (n * (a * (f + chain + b) + aw * w) + a * longer) / limit)
        if one_at_a_time:
            value = max(value, n * (f + chain + b + w) + longer)
        value = max(value, (f + chain + b + w) * (n / min(windows, n)) + extra * (crossed / min(windows, n)))
        return max(value, paced_last_w_end(n)) + tail

    def paced_last_w_end(n: int) -> float:
        """Bound 6's recurrence for this worker, every round trip at least `chain`: its first m
        micro-batches obey it for m (memory counted among those started, their B's and W's before
        its last W end), so the largest over m <= n holds, and grows with n as the covering
        search needs. Every m up to the stage's total from one run (`paced_w_ends`)."""
        if not paced:
            running = 0.0
            for value in paced_w_ends(costs, s, total, k, f + chain + b):
                running = max(running, value)
                paced.append(running)
        return paced[min(n, total)]

    return g


@lru_cache(maxsize=1024)
def _work_terms(costs: StageCosts, s: int, chain: float, total: int) -> dict[int, float]:
    """The work terms per n of `per_worker_bound`'s g, filled as they are asked for: shared by the
    g's that differ only in `extra`."""
    return {}


def forget() -> None:
    """Empty the per-worker caches (`per_worker_bound`, its work and recurrence terms): for
    measurements that swap one of their terms out."""
    per_worker_bound.cache_clear()
    _work_terms.cache_clear()
    _paced_terms.cache_clear()


@lru_cache(maxsize=1024)
def _paced_terms(costs: StageCosts, s: int, chain: float, total: int) -> list[float]:
    """The recurrence terms of `per_worker_bound`'s g for n = 0 .. total (the running largest over
    m <= n), filled whole on the first ask; shared like `_work_terms`."""
    return []


def most_served(g: Callable[[int], float], period: float, most: int) -> int:
    """max{n <= most : g(n) <= period} (g non-decreasing)."""
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if g(mid) <= period:
            lo = mid
        else:
            hi = mid - 1
    return lo


def least_covering(families: list[Callable[[int], float]], covers: Callable[[float], bool],
                   total: int) -> float:
    """The least P among the values g(n), 1 <= n <= total, of the (non-decreasing) `families` for
    which `covers(P)` holds, `covers` non-decreasing in P: the smallest such n per family by
    bisection. inf when none covers."""
    best = float("inf")
    for g in families:
        lo, hi = 1, total
        if not covers(g(hi)):
            continue
        while lo < hi:  # the smallest n whose g(n) covers the stage
            mid = (lo + hi) // 2
            if covers(g(mid)):
                hi = mid
            else:
                lo = mid + 1
        best = min(best, g(lo))
    return best


def least_period(kinds: Kinds, total: int) -> float:
    """The least P with sum over kinds of count x N(P) >= total, P one of the g values."""
    def covers(period: float) -> bool:
        return sum(count * most_served(g, period, total) for count, g in kinds) >= total

    return least_covering([g for _, g in kinds], covers, total)


def _stage_kinds(job: JobSpec, dead: set, s: int, hop: list[float]) -> tuple[int, Kinds]:
    """(how many stage-s workers are cut from the next stage, the stage's kinds of worker)."""
    costs = job.costs
    S, total = job.stages, job.pipelines * job.microbatches
    f, b = costs.forward, costs.backward_input
    alive = [p for p in range(job.pipelines) if (p, s) not in dead]
    last = s == S - 1
    cut = 0 if last else sum(1 for p in alive if (p, s + 1) in dead)
    rest = sum(f[t] + b[t] for t in range(s + 1, S)) + 2 * sum(hop[s + 1:])
    kinds: Kinds = []
    if cut:
        cross = min(costs.cross_p2p[s], costs.cross_p2p[s + 1])
        kinds.append((cut, per_worker_bound(costs, s, rest + 2 * cross, total)))
    if len(alive) > cut:
        own = rest if last else rest + 2 * hop[s]
        kinds.append((len(alive) - cut, per_worker_bound(costs, s, own, total)))
    return cut, kinds


def crossing_cost(costs: StageCosts, hop: list[float], first: int, last: int) -> float:
    """Least extra time a micro-batch's way between stages `first` and `last` (first < last) and its
    gradient's way back take when each must change pipelines at some hop in between: twice the
    least (cross - hop) over those hops."""
    return 2 * min(max(0.0, min(costs.cross_p2p[u], costs.cross_p2p[u + 1]) - hop[u])
                   for u in range(first, last))


def _kinds_by_crossing(job: JobSpec, dead: set, s: int, hop: list[float]) -> tuple[int, Kinds]:
    """(how many stage-s workers must cross pipelines below, the stage's kinds of worker by chain).

    A worker (p, s) whose pipeline has a dead stage below it, the nearest t, cannot carry a
    micro-batch to stage t on its own pipeline: its forward path to stage t and the gradient's way
    back each take at least one cross-pipeline hop, at some hop u in s..t-1, so its chain is at
    least the own one plus 2 min_u (cross_u - hop_u). With t = s + 1 this is the cut kind of
    `_stage_kinds`."""
    costs = job.costs
    S, total = job.stages, job.pipelines * job.microbatches
    alive = [p for p in range(job.pipelines) if (p, s) not in dead]
    if s == S - 1:
        return 0, [(len(alive), per_worker_bound(costs, s, 0.0, total))]
    own = chain_below(costs, hop, s)
    nearest_dead = [next((t for t in range(s + 1, S) if (p, t) in dead), None) for p in alive]
    extra_of = [0.0 if t is None else crossing_cost(costs, hop, s, t) for t in nearest_dead]
    kinds: Kinds = [(extra_of.count(extra), per_worker_bound(costs, s, own + extra, total))
                    for extra in sorted(set(extra_of), reverse=True)]
    return sum(t is not None for t in nearest_dead), kinds


def cut_worker_shares(job: JobSpec, failed: tuple[Worker, ...] | list[Worker]) -> list[int]:
    """How many micro-batches a cut worker serves at the period bound 4 gives its stage, for every
    stage with cut workers: the share a plan that reaches that bound would give it. The search uses
    them as the `keep` of mixes (`planner.routing.mixed_routing`)."""
    dead = set(map(tuple, failed))
    total = job.pipelines * job.microbatches
    hop = stage_hops(job.costs, job.stages)
    shares = set()
    for s in range(job.stages - 1):
        cut, kinds = _stage_kinds(job, dead, s, hop)
        if cut:
            g_cut = kinds[0][1]
            shares.add(min(job.microbatches, most_served(g_cut, least_period(kinds, total), total)))
    return sorted(shares)


def priced_trips(job: JobSpec, dead: set, s: int, hop: list[float], kinds: Kinds, base: float,
                 floor: float = 0.0) -> float:
    """Bound 4 at stage s with the round trips of each worker whose pipeline is alive below it priced
    by where they are served (module docstring, "Priced trips"); `base` (bound 4's value for the
    stage, `least_period(kinds)`) when that is no lower, when the stage has no such worker, or when
    the priced value could not pass `floor` (a bound already proven)."""
    costs, S, total = job.costs, job.stages, job.pipelines * job.microbatches
    if s == S - 1:
        return base
    extra = crossing_cost(costs, hop, s, s + 1)
    alive = [p for p in range(job.pipelines) if (p, s) not in dead]
    uncrossed = sum(all((p, t) not in dead for t in range(s + 1, S)) for p in alive)
    # `_kinds_by_crossing` puts the extra-0 kind last; it is the uncrossed workers alone unless some
    # crossed worker's crossing is free too, and then the pricing is left out.
    if extra <= 0 or not uncrossed or kinds[-1][0] != uncrossed:
        return base
    others = kinds[:-1]
    g_own = per_worker_bound(costs, s, chain_below(costs, hop, s), total, extra)
    g_next = per_worker_bound(costs, s + 1, chain_below(costs, hop, s + 1), total)

    def least_with(capacity: int) -> float:
        """Q(c): the least covering period with every uncrossed worker's own trips capped at c."""
        return least_period([*others, (uncrossed, lambda n: g_own(n, capacity))], total)

    # At `enough` the next stage serves what the own trips need: the priced value is no higher.
    enough = max(base, floor)
    if least_with(most_served(g_next, enough, total)) <= enough:
        return base
    # min over c of max(g_next(c), Q(c)): g_next non-decreasing, Q non-increasing in c, so the
    # optimum sits where g_next(c) first reaches Q(c), or just before.
    lo, hi = 0, total
    if g_next(hi) < least_with(hi):
        return max(base, least_with(hi))
    while lo < hi:  # the least c with g_next(c) >= Q(c)
        mid = (lo + hi) // 2
        if g_next(mid) >= least_with(mid):
            hi = mid
        else:
            lo = mid + 1
    best = g_next(lo) if lo == 0 else min(g_next(lo), least_with(lo - 1))
    return max(base, best)


def sharing_bound(job: JobSpec, failed: tuple[Worker, ...] | list[Worker], floor_ms: float = 0.0) -> Bound:
    """Bound 4 over every stage (module docstring). With no cut worker it prices the even split,
    which adds to bound 3 only the one-at-a-time term. The priced trips are only searched above
    `floor_ms` (a bound already proven) and above every stage's own value: below that they cannot
    raise the result, and one feasibility test is all they cost."""
    dead = set(map(tuple, failed))
    total = job.pipelines * job.microbatches
    hop = stage_hops(job.costs, job.stages)
    best = Bound(0.0, "")
    stages = []
    for s in range(job.stages):
        cut, kinds = _kinds_by_crossing(job, dead, s, hop)
        stages.append((cut, kinds, least_period(kinds, total)))
    floor = max([floor_ms] + [value for _, _, value in stages])
    for s, (cut, kinds, value) in enumerate(stages):
        priced = priced_trips(job, dead, s, hop, kinds, value, floor)
        if priced > value and priced > best.value_ms:
            best = Bound(priced, f"priced round trips at stage {s}: the stage-{s + 1} workers serve "
                                 f"their own pipeline's micro-batches only so fast, the rest cross "
                                 f"pipelines")
            continue
        if value > best.value_ms:
            alive = sum(count for count, _ in kinds)
            best = Bound(value, f"sharing at stage {s}: {cut} of {alive} workers cut from a "
                                f"stage below, {total} micro-batches" if cut else
                                f"round trips held in memory at stage {s}: {total} micro-batches "
                                f"on {alive} workers")
    return best
