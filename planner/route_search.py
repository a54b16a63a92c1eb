"""Local search over which peer serves each micro-batch, list-scheduled and replayed.

The routings of `planner.routing` deal moved micro-batches out in index order, so which peer takes
which one is a convention, and the list scheduler's period is sensitive to it: on 8 x 8 x 24 with
[0, 4] failed, swapping the peers of two re-routed micro-batches (0, 12) and (0, 13) took one tail
policy from 1465.5 to 1447.6 ms, and a few dozen such swaps reach 1442.7-1444.1 ms (three seeds),
where the grid, the tail policies and CP-SAT's LNS (120 s) stopped at 1452.9-1454.6 ms against the
bound's 1405.3 (docs/notes/planner-issue8.md, J). The peers' loads do not move, so no bound of the
routing changes; what changes is when each peer's extra work arrives relative to its own, which
decides whether the busiest peers can run their last forwards back to back.

The search: swap the executors of two micro-batches of one stage (different peers; among the moved
ones, and where a pipeline lost two stages half the time among all, `ANY_SHARE`), schedule
the routing with the given list policies (the solve passes one), keep the swap when the best period
is no worse (equal periods let it walk a plateau, where most of the gains above were found); a swap
whose one-iteration list schedule already has a worker span well above the current period is
rejected without its replay (`SPAN_MARGIN`), which more than halves a rejected swap's cost.
With `still_stages` (the solve sets it on jobs up to `candidates.MIXES_ALWAYS_MAX_OPS` ops, where
the swap cap rather than the wall ends the search), a stage where no two moved micro-batches have
different peers is searched among all its micro-batches: which micro-batches cross pipelines there
still decides how the crossings fall on the workers upstream. On a made-up 2 x 2 x 22 job with
(0, 0) dead the lone stage-0 worker holds two micro-batches and alternates the two pipelines'
micro-batches through them, so with stage 1 untouched (the balanced routing) one memory slot
carried every crossing round trip (533.2 ms with the list policy that won); the heuristic's best
was 506.7 (a mix), and swaps at stage 1 from the balanced routing reached 492.1 in 200
(docs/notes/planner-issue8.md, AR). Over 390 fresh made-up failure cases (heuristic only) it made
44 plans better and 17 worse, and with CP-SAT after it, on the 38 of those that miss the bar,
13 better and 7 worse (mean -0.28%; seed 39's 3 x 5 x 21 stage 1.110 -> 1.062). On larger jobs
the wall ends the search and these swaps dilute the rest (the one of 27 such cases they changed,
8 x 8 x 17 spread, went from 499.7 to 502.0 ms).
A `judge` may replace the list policies: any function from a routing to a schedule (or None).
The solve passes the insertion of the re-routed work into a fault-free template when that
insertion is the best candidate, which the list policies do not reproduce (made-up 5 x 8 x 12 with
(3, 4) dead: 335.3 -> 331.2 ms in 200 swaps; docs/notes/planner-issue8.md, AU).
Seeded, so the sequence of swaps is deterministic; it stops at its evaluation cap, at the deadline,
or at the bound.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.bounds import alive_per_stage
from planner.heuristic import Policy, list_schedule
from planner.routing import Routing
from planner.simulator import ReplayError, replay
from planner.spec import JobSpec
from planner.timeline import Op

MAX_EVALUATIONS = 200
"""Swaps tried at most (each is one list schedule and replay per policy: ~29 ms per policy at
8 x 8 x 24). On 8 x 8 x 24 [0, 4], six seeds came within 1.03 of the bound after 16-179 swaps."""
NEAR_SHARE = 0.5
"""Share of swaps between micro-batches at most `NEAR` apart in the stage's (pipeline, index)
order: most of the gains measured were such swaps, which shift one peer's extra work slightly."""
NEAR = 3
SPAN_MARGIN = 0.02
"""A swap's list schedule is not replayed when some worker's span in it (first op to optimizer end,
one iteration) exceeds the current period by more than this share: the swap would not be kept.
The replayed period is not bounded by that span (the steady state shifts when inputs arrive), but
over 4,736 swaps on 93 made-up failure cases it was never more than 1.24% below it, so a swap the
search would keep is not skipped; most rejected swaps are skipped (8 x 2 x 23 stage: 156 of 200 at
3 ms), and a replay is 57% of a swap's cost there (10.0 of 17.5 ms). In the same 4 s of search the
routing search then tries 1.1-3x the swaps, never ending worse: 8 of 15 cases better, 7 equal
(docs/notes/planner-issue8.md, L)."""
ANY_SHARE = 0.5
"""Where some pipeline lost workers at two or more stages: the share of swaps drawn among all of a
stage's micro-batches, moved or not (on stages with two or more alive workers), instead of among
its moved ones. Rule 1 lets any peer serve any micro-batch, and a micro-batch such a pipeline keeps
crosses pipelines twice per lost stage: exchanging which worker serves it with a micro-batch of a
whole pipeline lets the critical worker's first and last round trips take the short path while
the loads stay. On a made-up 3 x 6 x 6 job with [1, 2], [1, 4] dead, moved-only swaps kept 1 of
500 (166.7 -> 166.6 ms) where these reached 161.9-166.6 ms in 500 (four seeds; the bound 146.7,
the fault-free plan 153.4), and the 10 s plan went from 165.2 to 160.2 ms. Elsewhere they only
dilute the moved-only swaps: on 8 x 8 x 24 with [0, 3] dead the 10 s plan went from 1439.6 to
1451.3 ms with them (docs/notes/planner-issue8.md, K)."""


@dataclass(frozen=True)
class RouteSearchResult:
    ops: list[Op]
    period_ms: float
    policy: Policy | None
    """The list policy that made `ops`; None when a `judge` did."""
    routing: Routing
    evaluations: int
    accepted: int
    """Swaps kept (sideways ones included)."""


def swapped(routing: Routing, a: tuple[int, int, int], b: tuple[int, int, int]) -> Routing:
    """`routing` with the executors of micro-batches `a` and `b` (home, index, stage; same stage,
    moved or not) exchanged. A micro-batch handed back to its alive home is no longer moved."""
    moved = routing.moved
    to_a, to_b = routing.executor(*b), routing.executor(*a)
    for key, executor in ((a, to_a), (b, to_b)):
        if executor == key[0]:
            moved.pop(key, None)
        else:
            moved[key] = executor
    return Routing(routing.job, routing.failed, moved)


def _loses_two_stages(routing: Routing) -> bool:
    """Whether some pipeline lost workers at two or more stages (where `ANY_SHARE` applies)."""
    pipelines = [p for p, _ in routing.failed]
    return len(set(pipelines)) < len(pipelines)


def _span(ops: list[Op]) -> float:
    """The longest time from a worker's first op to its last in one list-scheduled iteration
    (`SPAN_MARGIN`)."""
    first: dict = {}
    last: dict = {}
    for op in ops:
        w = op.worker
        if op.start_ms < first.get(w, float("inf")):
            first[w] = op.start_ms
        if op.end_ms > last.get(w, float("-inf")):
            last[w] = op.end_ms
    return max(last[w] - first[w] for w in first)


Judge = Callable[[Routing], "list[Op] | None"]
"""Schedules a routing in place of the list policies (`search_routing`'s `judge`)."""


def _period(job: JobSpec, ops: list[Op] | None,
            skip_above: float = float("inf")) -> tuple[float, list[Op]] | None:
    """`ops`' replayed period (with `ops`), or None: no schedule, a span above `skip_above`
    (`SPAN_MARGIN`), a replay that fails or does not settle."""
    if ops is None or _span(ops) > skip_above:
        return None
    try:
        report = replay(job, ops)
    except ReplayError:
        return None
    return (report.iteration_ms, ops) if report.converged else None


def _best(job: JobSpec, routing: Routing, policies: list[Policy],
          skip_above: float = float("inf"),
          judge: Judge | None = None) -> tuple[float, list[Op], Policy | None] | None:
    if judge is not None:
        found = _period(job, judge(routing), skip_above)
        return None if found is None else (*found, None)
    best = None
    for policy in policies:
        found = _period(job, list_schedule(job, routing, policy), skip_above)
        if found is not None and (best is None or found[0] < best[0] - 1e-9):
            best = (found[0], found[1], policy)
    return best


def search_routing(
    job: JobSpec,
    routing: Routing,
    policies: list[Policy],
    period_ms: float,
    bound_ms: float,
    deadline: float,
    max_evaluations: int = MAX_EVALUATIONS,
    seed: int = 0,
    any_share: float = ANY_SHARE,
    span_margin: float | None = SPAN_MARGIN,
    still_stages: bool = False,
    judge: Judge | None = None,
) -> RouteSearchResult | None:
    """The best routing found by swaps from `routing` (whose best list period is `period_ms`), or
    None when no swap beat it. `deadline` is a `time.perf_counter()` value; `any_share` the share
    of swaps drawn among all of a stage's micro-batches (0: moved ones only); `span_margin` see
    `SPAN_MARGIN` (None: replay every swap); `still_stages`: where some worker failed, also swap
    among all the micro-batches of each stage with two or more alive workers that swaps among moved
    micro-batches cannot change (none moved there, or all moved to one peer; module docstring).
    `judge`, when given, schedules each routing instead of `policies` (module docstring)."""
    by_stage: dict[int, list[tuple[int, int, int]]] = {}
    for key in sorted(routing.moved):
        by_stage.setdefault(key[2], []).append(key)
    stages = [s for s, keys in by_stage.items() if len({routing.executor(*k) for k in keys}) > 1]
    moved_stages = set(stages)
    shared = [s for s, alive in enumerate(alive_per_stage(job, routing.failed)) if alive > 1]
    if any_share > 0 and _loses_two_stages(routing):
        drawn_among_all = shared
    elif still_stages and routing.failed:
        drawn_among_all = [s for s in shared if s not in moved_stages]
    else:
        drawn_among_all = []
    every = {s: [(home, m, s) for home in range(job.pipelines) for m in range(job.microbatches)]
             for s in drawn_among_all}
    if every:
        stages = sorted(set(stages) | set(every))
    if not stages or not (policies or judge):
        return None
    rng = random.Random(seed)
    current, current_ms = routing, period_ms
    best: RouteSearchResult | None = None
    evaluations = accepted = draws = 0
    # Draws are capped too: a pair with one executor is skipped unevaluated, and the loop must end
    # even where such pairs are most of a stage's.
    while evaluations < max_evaluations and draws < 20 * max_evaluations and time.perf_counter() < deadline:
        draws += 1
        stage = rng.choice(stages)
        if stage not in moved_stages or (stage in every and rng.random() < any_share):
            keys = every[stage]
        else:
            keys = by_stage[stage]
        if rng.random() < NEAR_SHARE:
            i = rng.randrange(len(keys))
            j = min(len(keys) - 1, max(0, i + rng.randint(-NEAR, NEAR)))
            a, b = keys[i], keys[j]
        else:
            a, b = rng.sample(keys, 2)
        if current.executor(*a) == current.executor(*b):
            continue
        candidate = swapped(current, a, b)
        evaluations += 1
        skip_above = float("inf") if span_margin is None else current_ms * (1 + span_margin)
        found = _best(job, candidate, policies, skip_above, judge)
        if found is None or found[0] > current_ms + 1e-9:
            continue
        current, current_ms = candidate, found[0]
        accepted += 1
        if found[0] < (best.period_ms if best else period_ms) - 1e-9:
            best = RouteSearchResult(found[1], found[0], found[2], candidate, evaluations, accepted)
            if found[0] <= bound_ms + 1e-6:
                break
    if best is None:
        return None
    return replace(best, evaluations=evaluations, accepted=accepted)
