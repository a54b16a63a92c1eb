"""Bound 8, late round trips (planner/bounds_late.py, docs/notes/bounds.md section 9): hand-worked
values, where it does not apply, and falsification by random valid plans, the heuristic and CP-SAT
(its floor at 0) on jobs where a narrow stage lies upstream of a wider, heavier one."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.bounds import lower_bound
from planner.bounds_late import crossing_extra, delays, late_round_trip_bound
from planner.solve import plan
from planner.spec import JobSpec
from tests.planner.test_bound_soundness import random_valid_periods
from tests.planner.test_bound_wave import cp_sat_unfloored

# Stage 0 light, stage 1 heavy, free hops, no all-reduce: the round trips decide.
LIGHT_THEN_HEAVY = {"pipelines": 3, "stages": 2, "microbatches": 2, "forward_ms": [1.0, 5.0],
                    "backward_input_ms": [1.0, 5.0], "backward_weight_ms": [1.0, 1.0], "p2p_ms": 0.0,
                    "cross_pipeline_p2p_ms": 0.0, "allreduce_ms": 0.0, "optimizer_ms": 0.0,
                    "activation_mb": 2.0, "activation_w_mb": 2.0, "memory_limit_mb": 100.0}

# Made-up job #6 of `benchmarks/gap_unseen.py --seed 5`.
EIGHT_BY_SEVEN = {"pipelines": 8, "stages": 7, "microbatches": 7,
                  "forward_ms": [5.1, 4.6, 9.3, 6.3, 4.6, 9.0, 6.5],
                  "backward_input_ms": [4.8, 4.8, 10.1, 6.1, 4.4, 8.1, 7.4],
                  "backward_weight_ms": [2.6, 4.4, 3.7, 2.0, 3.5, 8.8, 3.1], "p2p_ms": 0.14,
                  "cross_pipeline_p2p_ms": 1.27, "allreduce_ms": 18.7, "optimizer_ms": 2.7,
                  "activation_mb": [2.3, 3.9, 2.5, 2.4, 3.1, 2.2, 3.6],
                  "activation_w_mb": [2.3, 3.9, 2.5, 2.4, 3.1, 2.2, 3.6], "memory_limit_mb": 27.3}


def test_delays_count_how_many_workers_wait_how_long():
    """Two stage-0 workers (F = 1) feed three stage-1 workers: two get a first micro-batch at once,
    the third one F later. Through stages with 2 and 3 workers (F = 1 and 4), seven stage-2 workers:
    the third waits one stage-0 F (1); the fourth to sixth one stage-1 F (4; they also wait one or
    two stage-0 F's, less); the seventh two stage-1 F's (8)."""
    assert delays([2, 3], [1.0, 5.0], 0, 1, 3) == Counter({0.0: 2, 1.0: 1})
    assert delays([2, 3, 7], [1.0, 4.0, 9.0], 0, 2, 7) == Counter({0.0: 2, 1.0: 1, 4.0: 3, 8.0: 1})


def test_a_third_heavy_worker_fed_by_two_light_ones():
    """3 x 2 x 2, stage 0 of pipeline 2 dead. Each stage-1 worker serves two (one serving three takes
    30 ms more): first op -> last B end 2 x (5 + 5) = 20 (its W's can wait), and the round trip
    adds F_0 + B_0 + W_0 = 3 (free hops, no all-reduce): bound 2 claims 23. Two stage-0 workers
    send the first micro-batches, so the third stage-1 worker starts one F_0 = 1 late (24); and the
    three last micro-batches come back to two stage-0 workers, one of which runs two B_0 + W_0
    pairs, so one stage-1 worker must end B_0 + W_0 = 2 earlier: 25, which CP-SAT (floored at 0)
    proves optimal."""
    job, failed = JobSpec.parse(LIGHT_THEN_HEAVY), [(2, 0)]
    late = late_round_trip_bound(job, failed)
    assert late.value_ms == pytest.approx(25.0)
    assert "end of the iteration" in late.reason
    assert lower_bound(job, failed).value_ms == pytest.approx(25.0)
    best, status = cp_sat_unfloored(job, failed, deterministic_time=20.0)
    assert (best, status) == (pytest.approx(25.0), "OPTIMAL")


def test_a_worker_whose_pipeline_lost_a_stage_above_crosses_pipelines_both_ways():
    """2 x 2 x 1, stage 0 of pipeline 1 dead, cross hop 3 (same-pipeline hop 0). Bound 2: F_0 + B_0
    + W_0 = 3 around stage 1's stretch of one micro-batch (F + B = 10): 13. (1, 1)'s micro-batch
    comes from (0, 0) and its gradient goes back there, over a cross hop each way: 13 + 2 x 3 = 19;
    serving both on (0, 1) instead takes 3 + 2 x 10 = 23. The start side alone claims 14 (one F_0
    late), the end side 15 (one B_0 + W_0 early). CP-SAT (floored at 0) proves 19 optimal."""
    job = JobSpec.parse({**LIGHT_THEN_HEAVY, "pipelines": 2, "microbatches": 1,
                         "cross_pipeline_p2p_ms": 3.0})
    late = late_round_trip_bound(job, [(1, 0)])
    assert late.value_ms == pytest.approx(19.0)
    assert "1 of them cross pipelines" in late.reason
    assert crossing_extra(job.costs, [0.0], {(1, 0)}, 1, 0, 1) == pytest.approx(6.0)
    assert crossing_extra(job.costs, [0.0], {(1, 0)}, 0, 0, 1) == 0.0
    best, status = cp_sat_unfloored(job, [(1, 0)], deterministic_time=20.0)
    assert (best, status) == (pytest.approx(19.0), "OPTIMAL")


def test_the_made_up_job_that_found_it():
    """8 x 7 x 7, stage 0 of pipeline 7 and stage 1 of pipeline 6 dead: seven workers at stages 0
    and 1, eight at stage 5, whose round trip from stage 0 binds fault-free (bound 2, each stage-5
    worker serving 7). One stage-5 worker's last micro-batch comes back to a stage-0 worker that
    runs another one's B_0 + W_0 = 4.8 + 2.6 = 7.4 after it (stage 1 adds one B_1 = 4.8 only), so
    it must end 7.4 earlier; serving 6 instead would put 8 on another, F_5 + B_5 = 17.1 dearer.
    The start side is one F_0 = 5.1 (stage 1: F_1 = 4.6)."""
    job, failed = JobSpec.parse(EIGHT_BY_SEVEN), [(6, 1), (7, 0)]
    round_trip = lower_bound(job, []).value_ms
    assert lower_bound(job, []).reason == "round trip from stage 0 to stage 5"
    late = late_round_trip_bound(job, failed)
    assert late.value_ms == pytest.approx(round_trip + 7.4)
    assert late.reason.startswith("late round trips from stage 0 to stage 5")
    assert lower_bound(job, failed).value_ms == pytest.approx(round_trip + 7.4)


@pytest.mark.parametrize("failed", [
    [],                        # nobody is narrow
    [(2, 1)],                  # the narrow stage is the heavy one itself, nothing below it
    [(0, 0), (1, 1), (2, 1)],  # stage 1 is narrower than stage 0 and crossing is free
])
def test_it_does_not_apply_without_a_narrower_stage_upstream_or_a_costly_crossing(failed):
    assert late_round_trip_bound(JobSpec.parse(LIGHT_THEN_HEAVY), failed).value_ms == 0.0


def test_a_stage_without_survivors_claims_nothing_instead_of_dividing_by_zero():
    assert late_round_trip_bound(JobSpec.parse(LIGHT_THEN_HEAVY), [(0, 0), (1, 0), (2, 0)]).value_ms == 0.0


@st.composite
def late_cases(draw, heavy_w=(3, 8)):
    """Jobs where bound 8 applies: one to two dead workers at an upstream stage, a heavier stage below
    it, sometimes one more dead there, memory from one micro-batch at a time to unlimited.
    `heavy_w`: the range of the heavy stage's W (bound 9's tests draw it heavier)."""
    D, S, M = draw(st.integers(2, 4)), draw(st.integers(2, 3)), draw(st.integers(1, 3))
    upstream = draw(st.integers(0, S - 2))
    heavy = draw(st.integers(upstream + 1, S - 1))

    def times(low=3, high=8):
        return [float(draw(st.integers(low, high) if s == heavy else st.integers(1, 4))) for s in range(S)]
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": times(),
            "backward_input_ms": times(), "backward_weight_ms": times(*heavy_w),
            "p2p_ms": float(draw(st.integers(0, 2))), "cross_pipeline_p2p_ms": float(draw(st.integers(0, 3))),
            "allreduce_ms": float(draw(st.integers(0, 6))), "optimizer_ms": float(draw(st.integers(0, 2))),
            "activation_mb": 2.0, "activation_w_mb": draw(st.sampled_from([2.0, 1.0])),
            "memory_limit_mb": draw(st.sampled_from([2.0, 4.0, 6.0, 100.0]))}
    dead = draw(st.sets(st.integers(0, D - 1), min_size=1, max_size=min(2, D - 1)))
    failed = [(p, upstream) for p in sorted(dead)]
    if draw(st.booleans()):
        failed.append((draw(st.integers(0, D - 1)), heavy))
    return JobSpec.parse(spec), sorted(set(failed)), draw(st.integers(0, 2**31))


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(late_cases())
def test_no_random_valid_plan_nor_the_heuristic_beats_it(case):
    job, failed, seed = case
    periods = random_valid_periods(job, failed, seed, 20)
    periods.append(plan(job, failed, use_cp=False).iteration_ms)
    assert min(periods) >= late_round_trip_bound(job, failed).value_ms


@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(late_cases())
def test_cp_sat_without_the_bound_never_beats_it(case):
    """CP-SAT's full model with its floor at 0 (not at the analytic bound), from the heuristic plan."""
    job, failed, _ = case
    best, _ = cp_sat_unfloored(job, failed, deterministic_time=1.0)
    bound = late_round_trip_bound(job, failed).value_ms
    assert best >= bound - 1e-9, (best, bound)
