"""Bound 9, late round trips against the stage's span (planner/bounds_span.py, docs/notes/bounds.md
section 10): hand-worked values, the pairings it enumerates, where it does not apply, and
falsification by random valid plans, the heuristic and CP-SAT (its floor at 0) on jobs where a
narrow stage lies upstream of a stage heavy in W."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings

from planner.bounds import lower_bound
from planner.bounds_late import late_round_trip_bound
from planner.bounds_span import _pairings, span_round_trip_bound
from planner.solve import plan
from planner.spec import JobSpec
from tests.planner.test_bound_late import late_cases
from tests.planner.test_bound_soundness import random_valid_periods
from tests.planner.test_bound_wave import cp_sat_unfloored

# Stage 0 light, stage 1 heavy with a long W; free hops, no all-reduce.
LIGHT_THEN_HEAVY_W = {"pipelines": 3, "stages": 2, "microbatches": 2, "forward_ms": [2.0, 10.0],
                      "backward_input_ms": [2.0, 10.0], "backward_weight_ms": [2.0, 5.0],
                      "p2p_ms": 0.0, "cross_pipeline_p2p_ms": 0.0, "allreduce_ms": 0.0,
                      "optimizer_ms": 0.0, "activation_mb": 2.0, "activation_w_mb": 2.0,
                      "memory_limit_mb": 100.0}

# Made-up job #8 of `benchmarks/gap_unseen.py --seed 5`.
SEVEN_BY_FIVE = {"pipelines": 7, "stages": 5, "microbatches": 6,
                 "forward_ms": [3.0, 3.0, 6.9, 8.6, 2.9], "backward_input_ms": [2.8, 3.3, 6.3, 8.2, 3.0],
                 "backward_weight_ms": [2.3, 2.5, 3.4, 6.0, 1.1], "p2p_ms": 0.46,
                 "cross_pipeline_p2p_ms": 2.25, "allreduce_ms": 5.3, "optimizer_ms": 0.9,
                 "activation_mb": [3.7, 4.0, 3.1, 2.3, 1.5], "activation_w_mb": [3.7, 4.0, 3.1, 2.3, 1.5],
                 "memory_limit_mb": 20.0}


def test_pairings_are_every_split_of_the_late_workers_between_the_two_ends():
    """One worker late at the start (delay 2) and one early at the end (advance 4), of three: the
    same worker, or two different ones."""
    options = _pairings(Counter({0.0: 2, 2.0: 1}), Counter({0.0: 2, 4.0: 1}))
    assert sorted(sorted(o.items()) for o in options) == sorted([
        sorted({(2.0, 4.0): 1, (2.0, 0.0): 0, (0.0, 4.0): 0, (0.0, 0.0): 2}.items()),
        sorted({(2.0, 4.0): 0, (2.0, 0.0): 1, (0.0, 4.0): 1, (0.0, 0.0): 1}.items()),
    ])
    assert _pairings(Counter({0.0: 3}), Counter({0.0: 2, 4.0: 1})) == [{(0.0, 0.0): 2, (0.0, 4.0): 1}]
    assert _pairings(Counter({0.0: 1, 1.0: 1, 2.0: 1}), Counter({0.0: 3})) is None


def test_the_late_worker_cannot_both_wait_and_work_without_a_break():
    """3 x 2 x 2, stage 0 of pipeline 2 dead; every stage-1 worker serves two (three would take
    75). Stage 1's work per worker 2 x (10 + 10 + 5) = 50: bounds 1-3 claim 50. Two stage-0 workers
    send the first micro-batches, so one stage-1 worker starts one F_0 = 2 late; three last
    gradients come back to two stage-0 workers, so one stage-1 worker must end its last B
    B_0 + W_0 = 4 early. Bound 8 takes each end alone: first op -> last B end 2 x 20 = 40 (the W's
    wait), with F_0 = 2 before and B_0 + W_0 = 4 after: 46 + 4 = 50 at the end side. Let stage 1's
    first op be x after the earliest possible: the late worker ends 50 + 2 - x after it (span), the
    early-ending one needs 2 + x + 40 + 4 + 4 = 50 + x; both at 51 for x = 1. Putting both on one
    worker costs it 52 whatever x. CP-SAT (floored at 0) proves 51 optimal."""
    job, failed = JobSpec.parse(LIGHT_THEN_HEAVY_W), [(2, 0)]
    assert late_round_trip_bound(job, failed).value_ms == pytest.approx(50.0)
    span = span_round_trip_bound(job, failed)
    assert span.value_ms == pytest.approx(51.0, abs=1e-6)
    assert span.value_ms <= 51.0
    assert "against stage 1's span" in span.reason
    assert lower_bound(job, failed).value_ms == pytest.approx(51.0, abs=1e-6)
    best, status = cp_sat_unfloored(job, failed, deterministic_time=30.0)
    assert (best, status) == (pytest.approx(51.0), "OPTIMAL")


def test_the_made_up_job_that_found_it():
    """7 x 5 x 6, stages 2 and 4 of pipeline 4 dead: six stage-2 workers feed seven stage-3 workers
    (6 x (8.6 + 8.2 + 6.0) = 136.8 of work each, all-reduce and optimizer 6.2: 143.0, the
    fault-free period). One stage-3 worker gets its first micro-batch one F_2 = 6.9 late; one must
    end its last B one B_2 = 6.3 early. The way down is F_0 + F_1 + F_2 and three hops of 0.46:
    14.28; first op -> last B end is 6 x (8.6 + 8.2) = 100.8 (the W's wait); the way back
    B_2 + B_1 + B_0, three hops, W_0, all-reduce and optimizer: 22.28. The late worker ends
    143.0 + 6.9 - x after stage 3's first op; the early-ending one needs 14.28 + x + 100.8 + 22.28
    + 6.3 = 143.66 + x: both at 146.78 for x = 3.12 (bound 8: 144.26; the 10 s plan 150.13)."""
    job, failed = JobSpec.parse(SEVEN_BY_FIVE), [(4, 2), (4, 4)]
    assert lower_bound(job, []).value_ms == pytest.approx(143.0)
    assert late_round_trip_bound(job, failed).value_ms == pytest.approx(144.26)
    span = span_round_trip_bound(job, failed)
    assert span.value_ms == pytest.approx(146.78, abs=1e-6)
    assert span.reason.startswith("late round trips from stage 0 to stage 3 against stage 3's span")
    assert lower_bound(job, failed).value_ms == pytest.approx(146.78, abs=1e-6)
    assert plan(job, failed, use_cp=False).iteration_ms >= span.value_ms


@pytest.mark.parametrize("failed", [
    [],                        # nobody is narrow
    [(2, 1)],                  # the narrow stage is the heavy one itself, nothing upstream
    [(0, 0), (1, 1), (2, 1)],  # stage 1 is narrower than stage 0
])
def test_it_does_not_apply_without_a_narrower_stage_upstream(failed):
    assert span_round_trip_bound(JobSpec.parse(LIGHT_THEN_HEAVY_W), failed).value_ms == 0.0


def test_a_stage_without_survivors_claims_nothing():
    job = JobSpec.parse(LIGHT_THEN_HEAVY_W)
    assert span_round_trip_bound(job, [(0, 0), (1, 0), (2, 0)]).value_ms == 0.0


def span_cases():
    """Bound 8's drawn jobs (a narrow stage above a heavier one) with the heavy stage's W drawn from
    2-9 ms, so that its span binds."""
    return late_cases(heavy_w=(2, 9))


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(span_cases())
def test_no_random_valid_plan_nor_the_heuristic_beats_it(case):
    job, failed, seed = case
    periods = random_valid_periods(job, failed, seed, 20)
    periods.append(plan(job, failed, use_cp=False).iteration_ms)
    assert min(periods) >= span_round_trip_bound(job, failed).value_ms


@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(span_cases())
def test_cp_sat_without_the_bound_never_beats_it(case):
    """CP-SAT's full model with its floor at 0 (not at the analytic bound), from the heuristic plan."""
    job, failed, _ = case
    best, _ = cp_sat_unfloored(job, failed, deterministic_time=1.0)
    bound = span_round_trip_bound(job, failed).value_ms
    assert best >= bound - 1e-9, (best, bound)
