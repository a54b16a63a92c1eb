"""Bound 8 (docs/notes/bounds.md, section 9): narrow stages upstream make some round trips start late.

Bound 2's round trip a -> t -> a lets every stage-t worker receive its first micro-batch at
E_a + there(a, t), E_a the earliest start of a stage-a worker. A stage-u worker (a <= u < t) runs its
F's one at a time, none before E_a + there(a, u), so its m-th F reaches stage t at the earliest
(m - 1) F_u after that; with alive_u workers at stage u, at most alive_u x m micro-batches reach
stage t less than m F_u late. Each stage-t worker that serves anything receives a first micro-batch
of its own, so the j-th of them to receive one starts at least

    delay_j = max over u in [a, t) of F_u x (ceil(j / alive_u) - 1)

late, and its stretch (first op -> last B end, bound 2 with bound 3 and 6's pacing) follows from
there. The return is the mirror image: the B's of the stage-t workers' last micro-batches pass every
stage u on the way back to a, a stage-u worker runs them one at a time, and at stage a each also
needs its W before the all-reduce, so the j-th worker from the last to end its last B ends it at
least max over u of X_u x (ceil(j / alive_u) - 1) before the latest time that still lets stage a
finish, X_u = B_u for u > a and B_a + W_a at a (each side is a bound of its own; they are not
added: the plan may make different workers late at the two ends). With C = there + back +
W_a + AR_a + OPT_a, worker j can serve at most N_j(P) = max{n : C + delay_j + stretch_t(n) <= P}
micro-batches, and the stage-t workers must serve all D x M: P is the least value with
sum_j N_j(P) >= D x M, found by bound 4's bisection. Where every stage between a and t has at least
as many alive workers as stage t, every delay is 0 and this is bound 2 with the even split.

A third side prices crossings instead of delays: a stage-t worker (p, t) whose pipeline lost a stage
u in [a, t) serves only micro-batches that were at stage u on other pipelines, so its first one
comes down, and its last gradient goes back, over at least one cross-pipeline hop each, somewhere
between u and t (bound 4's deeper cuts, mirrored): its round trip is 2 min_v (cross_v - hop_v)
longer, v in [u, t) (`crossing_extra`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from functools import lru_cache

from planner.bounds import (
    Bound,
    alive_per_stage,
    chain_below,
    first_op_to_last_b,
    holds,
    paced_stage,
    stage_hops,
)
from planner.bounds_sharing import crossing_cost, least_period
from planner.spec import JobSpec, StageCosts, Worker

SPAN = 1
"""Stretches are computed for n within SPAN of the even split; below it a worker is taken to serve
n for free and above it no dearer than at the top (both only weaken the bound), since bound 6's
pacing costs n x k steps per n."""


@lru_cache(maxsize=4096)  # failure sets of one job ask for the same stretches
def stage_stretch(costs: StageCosts, t: int, n: int, chain: float) -> float:
    """Least time from a stage-t worker's first op to its last B end with n micro-batches (bound 2's
    stretch: work, forced idle, W's deferred past the last B, and bounds 3 and 6's memory pacing)."""
    k = holds(costs, t, n)
    round_trip = costs.forward[t] + chain + costs.backward_input[t]
    return first_op_to_last_b(costs, t, n, k, chain, paced_stage(costs, t, n, k, round_trip))


def delays(alive: list[int], per_op: list[float], first: int, last: int, workers: int) -> Counter:
    """How many of `workers` stage-`last` workers get each least delay: the j-th is at least
    max over u in [first, last) of per_op[u] x (ceil(j / alive[u]) - 1) late (module docstring)."""
    on_time = min(min(alive[first:last]), workers)  # one F (or B) each: nobody waits
    late = Counter(max(per_op[u] * (-(-j // alive[u]) - 1) for u in range(first, last))
                   for j in range(on_time + 1, workers + 1))
    late[0.0] += on_time
    return late


def stage_stretches(costs: StageCosts, t: int, chain: float, total: int, workers: int,
               ) -> Callable[[int], float]:
    """stretch_t as a non-decreasing function of n, exact near the even split (`SPAN`)."""
    even = total / workers
    low, high = max(1, int(even) - SPAN), min(total, int(even) + 1 + SPAN)
    table: list[float] = []
    for n in range(low, high + 1):  # the running maximum keeps it non-decreasing and still a bound
        table.append(max(table[-1] if table else 0.0, stage_stretch(costs, t, n, chain)))

    def stretch(n: int) -> float:
        return 0.0 if n < low else table[min(n, high) - low]

    return stretch


def way_there_and_back(costs: StageCosts, hop: list[float], a: int, t: int) -> tuple[float, float]:
    """Bound 2's round trip a -> t -> a around stage t's stretch: (there, back), the F's of stages
    a..t-1 and their least hops, and the B's and hops up again (W_a, AR_a and OPT_a come on top)."""
    f, b = costs.forward, costs.backward_input
    return sum(f[v] + hop[v] for v in range(a, t)), sum(b[v] + hop[v] for v in range(a, t))


def late_sides(costs: StageCosts, alive: list[int], a: int, t: int) -> tuple[Counter, Counter]:
    """(start delays, end advances) of the stage-t workers on the round trip a -> t -> a (module
    docstring): one F per stage on the way down; one B per stage on the way back, and at stage a
    also its W before AR_a."""
    b, w = costs.backward_input, costs.backward_weight
    back_ops = [b[u] + (w[u] if u == a else 0.0) for u in range(len(alive))]
    return delays(alive, costs.forward, a, t, alive[t]), delays(alive, back_ops, a, t, alive[t])


def _late_by(fixed: float, stretch: Callable[[int], float]) -> Callable[[int], float]:
    """g(n) of a stage-t worker whose round trip costs `fixed` besides its stretch."""
    return lambda n: fixed + stretch(n) if n > 0 else 0.0


def crossing_extra(costs: StageCosts, hop: list[float], dead: set, p: int, a: int, t: int) -> float:
    """How much longer than bound 2's there-and-back a round trip a -> (p, t) -> a is at least, when
    pipeline p lost a stage u in [a, t) (the deepest one): every micro-batch (p, t) serves was at
    stage u on another pipeline, so its way down changes pipelines at some hop v in u..t-1, and so
    does its gradient's way back (bound 4's deeper cuts, mirrored). 0 when p lost none there."""
    u = max((v for v in range(a, t) if (p, v) in dead), default=None)
    return 0.0 if u is None else crossing_cost(costs, hop, u, t)


def late_round_trip_bound(job: JobSpec, failed: tuple[Worker, ...] | list[Worker]) -> Bound:
    """Bound 8 over every round trip a -> t whose stages a..t-1 include one with fewer alive
    workers than stage t, or a dead worker on the pipeline of a stage-t worker (module docstring);
    Bound(0.0, "") where there is none."""
    costs = job.costs
    S, total = job.stages, job.pipelines * job.microbatches
    dead = set(map(tuple, failed))
    alive = alive_per_stage(job, failed)
    if 0 in alive:
        return Bound(0.0, "")  # a stage with no survivor: no plan exists to bound
    hop = stage_hops(costs, S)
    best = Bound(0.0, "")
    for t in range(1, S):
        serving = [p for p in range(job.pipelines) if (p, t) not in dead]
        chain = chain_below(costs, hop, t)
        stretch = None
        for a in range(t):
            narrowest = min(alive[a:t])
            extra = Counter(crossing_extra(costs, hop, dead, p, a, t) for p in serving)
            sides: list[tuple[str, Counter]] = []
            if narrowest < alive[t]:
                for end, late in zip(("start", "end"), late_sides(costs, alive, a, t), strict=True):
                    sides.append((f"{narrowest} on the way ({end} of the iteration)", late))
            if any(extra):
                crossing = alive[t] - extra[0.0]
                sides.append((f"{crossing} of them cross pipelines on the way", extra))
            if not sides:
                continue
            stretch = stretch or stage_stretches(costs, t, chain, total, alive[t])
            there, back = way_there_and_back(costs, hop, a, t)
            fixed = there + back + costs.backward_weight[a] + costs.allreduce[a] + costs.optimizer[a]
            for side, late in sides:
                kinds = [(count, _late_by(fixed + d, stretch)) for d, count in sorted(late.items())]
                value = least_period(kinds, total)
                if value > best.value_ms:
                    best = Bound(value, f"late round trips from stage {a} to stage {t}: "
                                        f"{alive[t]} workers there, {side}")
    return best
