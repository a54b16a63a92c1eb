"""Bound 6, the F-start recurrence (planner/bounds.py `paced_stage`, docs/notes/bounds.md section 7).

When a worker holds as many micro-batches as its memory allows, its next F waits for a B end, and
where the micro-batches waiting for their W leave no room, for a W end: F starts are paced by round
trips, in whole groups. The memory-time term before it spread n round trips evenly over the k
slots (n x round trip / k), which undercounts both the W and the remainder group.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

import planner.bounds as bounds
import planner.bounds_sharing as bounds_sharing
from planner.bounds import lower_bound, paced_stage
from planner.cp import cpsat
from planner.simulator import replay
from planner.solve import plan
from planner.spec import JobSpec
from planner.validate import validate
from tests.planner.test_bound_soundness import random_valid_periods

# Made-up job 8 of `benchmarks/gap_unseen.py --seed 2` (7 x 4 x 18), stage 0's workers of
# pipelines 2, 5 and 6 dead: the other four carry 126 micro-batches, 32 on the busiest.
SEVEN_BY_FOUR = {
    "pipelines": 7, "stages": 4, "microbatches": 18, "forward_ms": [4.1, 6.0, 2.2, 2.6],
    "backward_input_ms": [4.1, 6.4, 2.4, 2.9], "backward_weight_ms": [1.6, 2.5, 1.2, 1.6],
    "p2p_ms": 0.37, "cross_pipeline_p2p_ms": 1.02, "allreduce_ms": 24.5, "optimizer_ms": 4.9,
    "activation_mb": [3.3, 1.5, 3.3, 3.4], "activation_w_mb": [2.47, 0.75, 2.47, 1.7],
    "memory_limit_mb": 11.0}
STAGE_ZERO_DEAD = [(2, 0), (6, 0), (5, 0)]


def test_hand_worked_seven_by_four():
    """Stage 0 holds 3 x 3.3 = 9.9 of 11 MB; a fourth F (3.3) fits only once one of the three has
    ended its B and, since 2 x 3.3 + 3.3 + 2.47 = 12.37 > 11, its W too. A round trip is
    F + (F + B at stages 1-3) + B + 6 hops of 0.37 = 4.1 + 22.5 + 4.1 + 2.22 = 32.92 ms, so the
    1st micro-batch's B may start at 28.82 and the 4th F at 28.82 + B + W = 34.52. The 5th F needs
    two B's and W's ended, both after 28.82, and the 4th F between them: 28.82 + 2 x 5.7 + 4.1 =
    44.32; the 6th 54.12: inside a group the F's go B + W + F = 9.8 apart, and each F starts
    34.52 after the one three earlier. The 31st (group 11's first) starts at 10 x 34.52 = 345.2,
    the 32nd at 355.0. Its W ends >= 355.0 + 34.52 = 389.52, then all-reduce and optimizer:
    + 24.5 + 4.9 = 418.92. Spacing F's one F apart said 413.22; the even spread
    32 x 32.92 / 3 + 1.6 + 29.4 = 382.15."""
    job = JobSpec.parse(SEVEN_BY_FOUR)
    paced = paced_stage(job.costs, 0, 32, 3, 32.92)
    assert paced.last_f_start == pytest.approx(355.0, abs=1e-9)
    assert paced.last_w_end == pytest.approx(389.52, abs=1e-9)
    bound = lower_bound(job, STAGE_ZERO_DEAD)
    assert bound.value_ms == pytest.approx(418.92, abs=1e-9)
    assert bound.reason.startswith("memory-time at stage 0: 32 micro-batches, 3 held at once")


def test_without_pending_w_the_groups_are_whole_round_trips():
    """activation_w 0: only B ends free memory, so with k held at once the F's go in groups of k,
    one round trip from a group to the next. The first group's F's are one F apart; from the
    second group on each F needs one more B ended, so they go B + F apart: with k = 3, F = B = 1,
    round trip 10 (a B may start 9 after its F): 0, 1, 2 | 10, 12, 14 | 20, 22, 24 | 30. The n-th F
    for n = 1, 2, 3, 7, 8, 9, 10: 0, 1, 2, 20, 22, 24, 30."""
    job = JobSpec.parse({"pipelines": 1, "stages": 2, "microbatches": 10, "forward_ms": 1.0,
                         "backward_input_ms": 1.0, "backward_weight_ms": 1.0, "p2p_ms": 0.0,
                         "allreduce_ms": 0.0, "optimizer_ms": 0.0, "activation_mb": 2.0,
                         "activation_w_mb": 0.0, "memory_limit_mb": 6.0})
    assert [paced_stage(job.costs, 0, n, 3, 10.0).last_f_start for n in (1, 2, 3, 7, 8, 9, 10)] == \
        [0.0, 1.0, 2.0, 20.0, 22.0, 24.0, 30.0]


whole = st.integers(1, 4).map(float)


@st.composite
def memory_bound_cases(draw):
    """Small jobs whose stage 0 is cheap and short of memory while the stages below are slow, so
    its F's wait on round trips; stage 0 of pipeline 1 dead where there are two pipelines."""
    D, S, M = draw(st.integers(1, 2)), draw(st.integers(2, 3)), draw(st.integers(2, 4))
    below = st.lists(whole, min_size=S - 1, max_size=S - 1)
    spec = {"pipelines": D, "stages": S, "microbatches": M,
            "forward_ms": [1.0, *draw(below)], "backward_input_ms": [1.0, *draw(below)],
            "backward_weight_ms": [1.0, *draw(below)],
            "p2p_ms": draw(st.integers(0, 2).map(float)),
            "cross_pipeline_p2p_ms": draw(st.integers(0, 3).map(float)),
            "allreduce_ms": draw(st.integers(0, 3).map(float)),
            "optimizer_ms": draw(st.integers(0, 1).map(float)),
            "activation_mb": [2.0] + [1.0] * (S - 1),
            "activation_w_mb": [draw(st.sampled_from([1.0, 2.0]))] + [0.0] * (S - 1),
            "memory_limit_mb": draw(st.sampled_from([2.0, 3.0, 4.0, 5.0]))}
    job = JobSpec.parse(spec)
    failed = [(1, 0)] if D > 1 else []
    return job, failed, draw(st.integers(0, 2**31))


def raised_by_the_recurrence(job, failed, monkeypatch) -> float:
    """The bound, after checking that the recurrence is what raised it on this case (bound 4's
    per-worker caches emptied around the run without it, which holds the recurrence too)."""
    with_it = lower_bound(job, failed).value_ms
    with monkeypatch.context() as patch:
        patch.setattr(bounds, "RECURRENCE_MAX_STEPS", 0)
        bounds_sharing.forget()
        without = lower_bound(job, failed).value_ms
    bounds_sharing.forget()
    assume(with_it > without)
    return with_it


# Deterministic; the monkeypatch is restored inside each example, and most drawn cases are filtered
# out (`assume`: the recurrence must be what raised the bound).
FALSIFY = settings(deadline=None, derandomize=True, database=None,
                   suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                          HealthCheck.filter_too_much])


@settings(FALSIFY, max_examples=40)
@given(memory_bound_cases())
def test_no_random_valid_plan_beats_the_recurrence(monkeypatch, case):
    job, failed, seed = case
    bound = raised_by_the_recurrence(job, failed, monkeypatch)
    periods = random_valid_periods(job, failed, seed, 40, stay_home=lambda rng: 1.0)
    assert periods, "no random plan completed"
    assert min(periods) >= bound, (min(periods), bound)


@settings(FALSIFY, max_examples=8)
@given(memory_bound_cases())
def test_cp_sat_finds_no_plan_below_the_recurrence(monkeypatch, case):
    """CP-SAT, hinted with the planner's heuristic plan and not told the bound, searches below it."""
    job, failed, _ = case
    bound = raised_by_the_recurrence(job, failed, monkeypatch)
    hint = plan(job, failed, use_cp=False)
    canonical = list(hint.canonical.failed)
    ops = hint.ops if canonical == failed else plan(job, canonical, use_cp=False).ops
    period = replay(job, ops).iteration_ms
    found = cpsat.improve(job, tuple(canonical), ops, period + 1.0, 0.0, 3.0, seed=3)
    if found.ops is not None:
        assert validate(job, canonical, found.ops) == []
        assert found.period_ms >= bound, (found.period_ms, bound)


def direct_paced(costs, s, n, k, round_trip):
    """The recurrence of docs/notes/bounds.md section 7 read literally: for every F, every x and
    every released micro-batch i, the work that must follow i's release, with no prefix maxima."""
    f, b, w = costs.forward[s], costs.backward_input[s], costs.backward_weight[s]
    held, release = min(k, n), round_trip - b

    def after(starts, backs, weights, forwards):
        return max((starts[i] + release + (backs - i) * b + max(0, weights - i) * w
                    + max(0, forwards - i) * f for i in range(backs)), default=0.0)

    starts = [0.0]
    for j in range(1, n):
        least = float("inf")
        for x in range(held):
            y = bounds.pending_w_cap(costs, s, x + 1, n)
            if x > j or y < 0:
                break
            least = min(least, after(starts, j - x, j - x - y, j - held))
        starts.append(max(starts[-1] + f, least))
    return starts[-1], after(starts, n, 0, n - held), after(starts, n, n, n - held)


@settings(FALSIFY, max_examples=150)
@given(st.floats(0.5, 5), st.floats(0.5, 5), st.floats(0.1, 4), st.sampled_from([1.0, 2.0, 2.6, 3.3]),
       st.floats(0.0, 1.0), st.floats(1.0, 8.0), st.integers(2, 30), st.floats(5.0, 80.0))
def test_prefix_maxima_equal_the_direct_recurrence(f, b, w, act, w_share, slots, n, round_trip):
    """`paced_stage` takes the largest term over the released micro-batches from four running
    prefix maxima; the literal double loop must give the same three times."""
    job = JobSpec.parse({"pipelines": 1, "stages": 2, "microbatches": 2, "forward_ms": [f, 1.0],
                         "backward_input_ms": [b, 1.0], "backward_weight_ms": [w, 1.0],
                         "p2p_ms": 0.0, "allreduce_ms": 0.0, "optimizer_ms": 0.0,
                         "activation_mb": [act, 1.0], "activation_w_mb": [act * w_share, 0.0],
                         "memory_limit_mb": act * slots})
    k = bounds.holds(job.costs, 0, n)
    assume(k >= 1)
    paced = paced_stage(job.costs, 0, n, k, round_trip)
    expected = direct_paced(job.costs, 0, n, k, round_trip)
    assert (paced.last_f_start, paced.last_b_end, paced.last_w_end) == pytest.approx(expected, abs=1e-9)


def test_tiny_activations_bound_like_free_memory():
    """A positive activation below 1e-300 MB makes limit / activation overflow an int; the slot
    counts must then read "as many as asked", the same bound as with activations of 0 (the
    fuzzing above found the OverflowError)."""
    spec = {"pipelines": 2, "stages": 2, "microbatches": 4, "forward_ms": 1.0,
            "backward_input_ms": 1.0, "backward_weight_ms": 1.0, "p2p_ms": 0.5, "allreduce_ms": 1.0,
            "optimizer_ms": 0.5, "memory_limit_mb": 4.0}
    tiny = lower_bound(JobSpec.parse({**spec, "activation_mb": 1e-320, "activation_w_mb": 1e-321}),
                       [(1, 0)])
    free = lower_bound(JobSpec.parse({**spec, "activation_mb": 0.0, "activation_w_mb": 0.0}), [(1, 0)])
    assert tiny.value_ms == free.value_ms
