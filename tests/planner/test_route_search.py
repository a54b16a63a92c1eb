"""Which peer serves which moved micro-batch, searched by swaps (`planner.route_search`).

A swap exchanges the executors of two moved micro-batches of one stage, so every worker keeps its
load; the search keeps a swap when the list schedule's replayed period is no worse.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import replace
from pathlib import Path

from hypothesis import given
from hypothesis import strategies as st

from planner.bounds import lower_bound
from planner.candidates import heuristic_policies
from planner.heuristic import list_schedule
from planner.route_search import search_routing, swapped
from planner.routing import balanced_routing, mixed_routing
from planner.simulator import replay
from planner.spec import JobSpec
from planner.validate import validate
from tests.planner.test_properties import SETTINGS, jobs_with_failures

SCENARIO = Path(__file__).resolve().parents[3] / "shared" / "scenarios" / "gpt-1.5b-8x8x24.json"
NO_DEADLINE = float("inf")


def served(job, routing):
    """(stage, executing pipeline) -> how many micro-batches it serves, from `executor` alone."""
    return Counter((s, routing.executor(home, m, s)) for home in range(job.pipelines)
                   for m in range(job.microbatches) for s in range(job.stages))


def test_a_swap_exchanges_two_executors_and_nothing_else():
    job = JobSpec.parse({"pipelines": 4, "stages": 2, "microbatches": 3, "forward_ms": 1.0,
                         "backward_input_ms": 1.0, "backward_weight_ms": 1.0, "p2p_ms": 0.0,
                         "allreduce_ms": 0.0, "optimizer_ms": 0.0, "activation_mb": 1.0})
    routing = balanced_routing(job, ((0, 1),))
    # [0, 1]'s three micro-batches go one to each of pipelines 1, 2, 3 at stage 1.
    assert [routing.executor(0, m, 1) for m in range(3)] == [1, 2, 3]
    after = swapped(routing, (0, 0, 1), (0, 2, 1))
    assert [after.executor(0, m, 1) for m in range(3)] == [3, 2, 1]
    assert [routing.executor(0, m, 1) for m in range(3)] == [1, 2, 3]  # the original is untouched
    assert after.load == routing.load == [[3, 0], [3, 4], [3, 4], [3, 4]]


@SETTINGS
@given(jobs_with_failures(), st.randoms(use_true_random=False))
def test_any_swap_keeps_every_workers_load_and_schedules_validly(case, rng):
    job, failed = case
    failed = tuple(sorted(set(failed)))
    routing = balanced_routing(job, failed, rng.randrange(3))
    by_stage = {}
    for key in routing.moved:
        by_stage.setdefault(key[2], []).append(key)
    pairs = [keys for keys in by_stage.values() if len(keys) >= 2]
    if not pairs:
        return
    a, b = rng.sample(sorted(rng.choice(pairs)), 2)
    after = swapped(routing, a, b)
    assert (after.executor(*a), after.executor(*b)) == (routing.executor(*b), routing.executor(*a))
    assert served(job, after) == served(job, routing)
    ops = list_schedule(job, after, heuristic_policies(job)[0])
    assert validate(job, failed, ops) == []


@SETTINGS
@given(jobs_with_failures())
def test_the_search_keeps_loads_and_returns_a_valid_better_plan(case):
    job, failed = case
    failed = tuple(sorted(set(failed)))
    policy = heuristic_policies(job)[0]
    for routing in (balanced_routing(job, failed), mixed_routing(job, failed, job.microbatches // 2)):
        if routing is None:
            continue
        start = replay(job, list_schedule(job, routing, policy))
        if not start.converged:
            continue
        found = search_routing(job, routing, [policy], start.iteration_ms, 0.0, NO_DEADLINE,
                               max_evaluations=40)
        if found is None:
            continue
        assert found.period_ms < start.iteration_ms
        assert served(job, found.routing) == served(job, routing)
        assert validate(job, failed, found.ops) == []
        assert replay(job, found.ops).iteration_ms == found.period_ms
        again = search_routing(job, routing, [policy], start.iteration_ms, 0.0, NO_DEADLINE,
                               max_evaluations=40)
        assert again is not None and again.period_ms == found.period_ms  # seeded: deterministic


def test_the_8x8x24_middle_stage_failure_comes_within_the_bar_by_routing_alone():
    """The shared 8 x 8 x 24 job with [0, 4] dead, the one failure case of the bar's range left
    above 1.03 after the last-forwards-first policies (1454.6 ms against the proven 1405.3: 1.035):
    with the same policy and the same peer loads, swapping which peer serves which of [0, 4]'s
    micro-batches comes within 1.03 of the bound in at most 200 swaps (seed 0 reaches it in ~25)."""
    job = JobSpec.parse(json.loads(SCENARIO.read_text()))
    failed = ((0, 4),)
    bound = lower_bound(job, failed).value_ms
    routing = balanced_routing(job, failed, 0)
    policy = replace(heuristic_policies(job)[0], ahead_slack=1, tail_forwards=5, tail_upstream=True)
    start = replay(job, list_schedule(job, routing, policy)).iteration_ms
    assert start > 1.034 * bound
    found = search_routing(job, routing, [policy], start, bound, NO_DEADLINE, max_evaluations=200)
    assert found is not None
    assert validate(job, failed, found.ops) == []
    assert found.period_ms <= 1.03 * bound
