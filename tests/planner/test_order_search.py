"""Adjacent swaps of each worker's F/B order, re-timed by the sweep (`planner.order_search`).

Expected values come from outside the search: CP-SAT's proof of optimality on the made-up
1 x 5 x 10 (docs/notes/planner-issue8.md, P), the contract's rules (`validate`) and the
simulator's replay.
"""

from __future__ import annotations

import pytest
from hypothesis import given

from planner.bounds import lower_bound
from planner.heuristic import Policy, list_schedule
from planner.order_search import _may_swap, search_orders
from planner.routing import balanced_routing
from planner.simulator import replay
from planner.spec import JobSpec
from planner.validate import validate
from tests.planner.test_first_stage_spacing import FIVE_BY_TEN
from tests.planner.test_properties import SETTINGS, jobs_with_failures


def test_swaps_reach_the_proven_optimum_of_the_memory_paced_job():
    """From the spaced list schedule (262.4 ms) 600 swaps reach 255.6 ms, the period CP-SAT proves
    optimal for this job given 90 s; nothing valid is below it, so the search cannot overshoot."""
    job = JobSpec.parse(FIVE_BY_TEN)
    ops = list_schedule(job, balanced_routing(job, ()), Policy(w_tolerance=0.0, feed_bottleneck=True,
                                                                 first_stage_spacing=1.05))
    start = replay(job, ops).iteration_ms
    assert start == pytest.approx(262.4)
    found = search_orders(job, (), ops, start, lower_bound(job, ()).value_ms, 600, seed=0)
    assert found is not None
    assert found.period_ms == pytest.approx(255.6)
    assert validate(job, (), found.ops) == []
    assert replay(job, found.ops).iteration_ms == pytest.approx(found.period_ms)
    again = search_orders(job, (), ops, start, lower_bound(job, ()).value_ms, 600, seed=0)
    assert again is not None and again.ops == found.ops  # seeded: the same swaps, the same plan


def test_nothing_to_do_at_the_bound():
    job = JobSpec.parse(FIVE_BY_TEN)
    ops = list_schedule(job, balanced_routing(job, ()), Policy())
    period = replay(job, ops).iteration_ms
    assert search_orders(job, (), ops, period, bound_ms=period, max_evaluations=600) is None


def test_which_neighbours_may_swap():
    """(kind, home, index, stage): an F and a B of different micro-batches only."""
    assert _may_swap(("F", 0, 3, 1), ("B", 0, 1, 1))
    assert _may_swap(("B", 1, 0, 1), ("F", 0, 4, 1))
    assert not _may_swap(("F", 0, 3, 1), ("B", 0, 3, 1))  # its own B
    assert not _may_swap(("F", 0, 3, 1), ("F", 0, 4, 1))
    assert not _may_swap(("B", 0, 3, 1), ("B", 1, 3, 1))


@SETTINGS
@given(jobs_with_failures())
def test_a_found_plan_is_valid_and_strictly_shorter(case):
    """Whatever it returns satisfies the six rules, replays to the period it claims, and is shorter
    than where it started (the start's own orders re-timed by the sweep may already be: then no
    swap was kept)."""
    job, failed = case
    failed = tuple(failed)
    ops = list_schedule(job, balanced_routing(job, failed), Policy())
    start = replay(job, ops).iteration_ms
    found = search_orders(job, failed, ops, start, 0.0, 40, seed=1)
    if found is None:
        return
    assert found.period_ms < start - 1e-9
    assert validate(job, failed, found.ops) == []
    assert replay(job, found.ops).iteration_ms == pytest.approx(found.period_ms)
    assert 0 <= found.accepted <= found.evaluations <= 40
