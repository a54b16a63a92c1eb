"""Bound 9 (docs/notes/bounds.md, section 10): late round trips against the stage's own span.

Bound 8 (`planner.bounds_late`) prices a round trip a -> t -> a through narrow stages on the way:
the j-th stage-t worker to get its first micro-batch starts it at least `delay_j` late (the start
side), and the j-th from the last to end its last B must end it at least `advance_j` early (the end
side). A plan dodges each side alone: every stage-t worker may wait for the latest first
micro-batch, so nobody is late relative to anybody, and the worker late at the start need not be
the one that must end early. But a worker that starts late and works without a break ends late,
and stage t all-reduces after its latest worker: with s_w the first op of worker w,

    P >= max_w (s_w + n_w (F_t + B_t + W_t)) + AR_t + OPT_t - min_w s_w      (stage t's span)

So waiting costs the round trip back to stage a, and not waiting costs stage t's span. With
x = min_w s_w - E_a - there(a, t) >= 0 (E_a the earliest start at stage a; x is the plan's choice)
and a worker carrying start delay d and end advance e:
- its first op is at least there + max(x, d) after E_a, and at least max(0, d - x) after stage t's
  first op;
- span: n (F_t + B_t + W_t) <= P - AR_t - OPT_t - max(0, d - x);
- round trip (bound 8's, with the start it really has):
  there + max(x, d) + stretch_t(n) + back + W_a + AR_a + OPT_a + e <= P.
Each worker serves at most the largest n meeting both, and the stage's workers must serve all
D x M. Which worker carries which delay and which advance is the plan's choice too, so P is the
least value for which SOME x >= 0 and SOME pairing of the two sides' delays cover the stage: a
bisection on P, each step maximising the coverage over the candidate x (0 and the points where a
delayed worker's span term admits one more micro-batch) and over the pairings (a transportation
between the two sides' classes of equal delay, enumerated; only where both sides have at most two
classes, the case of one narrow stage, is the bound computed).
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable

from planner.bounds import Bound, alive_per_stage, bisect_covering, chain_below, stage_hops
from planner.bounds_late import late_sides, stage_stretches, way_there_and_back
from planner.bounds_sharing import most_served
from planner.spec import JobSpec, Worker

_EPS = 1e-9


def _pairings(starts: Counter, ends: Counter) -> list[dict[tuple[float, float], int]] | None:
    """Every way to pair the workers' start delays with their end advances, as counts per
    (delay, advance); None where either side has more than two classes (not enumerated)."""
    ds, es = sorted(starts), sorted(ends)
    if len(ds) > 2 or len(es) > 2:
        return None
    if len(ds) == 1 or len(es) == 1:
        return [{(d, e): starts[d] if len(ds) > 1 else ends[e] for d in ds for e in es}]
    (d0, d1), (e0, e1) = ds, es
    options = []
    for both in range(max(0, starts[d1] - ends[e0]), min(starts[d1], ends[e1]) + 1):
        options.append({(d1, e1): both, (d1, e0): starts[d1] - both,
                        (d0, e1): ends[e1] - both, (d0, e0): starts[d0] - ends[e1] + both})
    return options


def _covers(x: float, pairings: list[dict[tuple[float, float], int]], total: int,
            span_room: float, work: float, round_room: float,
            stretch: Callable[[int], float]) -> bool:
    """Whether the stage's workers can serve `total` with stage t's first op x after the earliest
    possible, under the best pairing; `span_room` and `round_room` are the period less stage t's
    all-reduce and optimizer, and less the way there and back."""
    best = 0
    for counts in pairings:
        served = 0
        for (d, e), count in counts.items():
            if count == 0:
                continue
            room = span_room - max(0.0, d - x)
            by_span = total if work <= 0 else max(0, math.floor(room / work + _EPS))
            by_trip = most_served(stretch, round_room - max(x, d) - e, total)
            served += count * min(by_span, by_trip)
        best = max(best, served)
    return best >= total


def _candidate_xs(starts: Counter, span_room: float, work: float, total: int) -> list[float]:
    """x = 0, and each x at which a delayed worker's span term first admits one more micro-batch
    (between those points only the round-trip term changes, and it only tightens as x grows)."""
    xs = {0.0}
    if work > 0:
        for d in starts:
            if d <= 0:
                continue
            lowest = max(0, math.floor((span_room - d) / work + _EPS))
            highest = min(total, max(0, math.floor(span_room / work + _EPS)))
            for n in range(lowest + 1, highest + 1):
                x = d - (span_room - work * n)
                if 0.0 <= x <= d:
                    xs.add(x)
    return sorted(xs)


def span_round_trip_bound(job: JobSpec, failed: tuple[Worker, ...] | list[Worker],
                          floor_ms: float = 0.0) -> Bound:
    """Bound 9 over every round trip a -> t with a narrower stage on the way (module docstring);
    Bound(0.0, "") where none applies. `floor_ms`: a value already proven (the bisection starts
    there; a result at or below it is not reported)."""
    costs = job.costs
    S, total = job.stages, job.pipelines * job.microbatches
    alive = alive_per_stage(job, failed)
    if 0 in alive:
        return Bound(0.0, "")
    hop = stage_hops(costs, S)
    best = Bound(0.0, "")
    for t in range(1, S):
        stretch = None
        work = costs.forward[t] + costs.backward_input[t] + costs.backward_weight[t]
        tail_t = costs.allreduce[t] + costs.optimizer[t]
        for a in range(t):
            if min(alive[a:t]) >= alive[t]:
                continue
            starts, ends = late_sides(costs, alive, a, t)
            pairings = _pairings(starts, ends)
            if pairings is None or len(starts) < 2:
                continue
            stretch = stretch or stage_stretches(costs, t, chain_below(costs, hop, t), total, alive[t])
            there, back = way_there_and_back(costs, hop, a, t)
            back = back + costs.backward_weight[a] + costs.allreduce[a] + costs.optimizer[a]

            covers = _coverage(starts, pairings, total, tail_t, work, there, back, stretch)
            value = _least_covering(covers, max(floor_ms, best.value_ms))
            if value is not None:
                best = Bound(value, f"late round trips from stage {a} to stage {t} against stage "
                                    f"{t}'s span: {alive[t]} workers there, {min(alive[a:t])} on the way")
    return best


def _coverage(starts: Counter, pairings: list[dict[tuple[float, float], int]], total: int,
              tail_t: float, work: float, there: float, back: float,
              stretch: Callable[[int], float]) -> Callable[[float], bool]:
    """Whether some x and some pairing cover the stage at a period (module docstring)."""
    def covers(period: float) -> bool:
        span_room = period - tail_t
        round_room = period - there - back
        return any(_covers(x, pairings, total, span_room, work, round_room, stretch)
                   for x in _candidate_xs(starts, span_room, work, total))

    return covers


def _least_covering(covers: Callable[[float], bool], floor_ms: float) -> float | None:
    """The largest period the bisection proves not to cover (within `bounds.BISECTION_MS` of the
    least covering one, never above it); None when `floor_ms` already covers (nothing above what is
    proven)."""
    lo = floor_ms
    if covers(lo):
        return None
    hi = max(lo, 1.0) * 2
    while not covers(hi):
        hi *= 2
        if hi > 1e12:  # never for a job the spec accepts; a bound must not hang
            return None
    return bisect_covering(covers, lo, hi)[0]
