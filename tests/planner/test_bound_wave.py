"""Bound 7, the first and last waves (planner/bounds_wave.py, docs/notes/bounds.md section 8):
hand-worked values, where it does not apply, and falsification by CP-SAT (its own bound switched off)
and by random valid plans on jobs where it applies."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.bounds import lower_bound
from planner.bounds_wave import wave_bound
from planner.cp import cpsat
from planner.simulator import replay
from planner.solve import plan
from planner.spec import JobSpec
from tests.planner.test_bound_soundness import random_valid_periods

# Made-up job #7 of `benchmarks/gap_unseen.py --seed 2`: one micro-batch at a time at both stages.
EIGHT_BY_TWO = {"pipelines": 8, "stages": 2, "microbatches": 2, "forward_ms": [5.2, 3.7],
                "backward_input_ms": [5.0, 4.2], "backward_weight_ms": [3.0, 2.6], "p2p_ms": 0.82,
                "cross_pipeline_p2p_ms": 1.55, "allreduce_ms": 37.2, "optimizer_ms": 3.1,
                "activation_mb": [2.7, 2.2], "activation_w_mb": [2.03, 0.55], "memory_limit_mb": 2.8}

# Made-up job #1 of `benchmarks/gap_unseen.py --seed 33`, with stage 1 of pipelines 1 and 3 dead.
FOUR_BY_THREE = {"pipelines": 4, "stages": 3, "microbatches": 5, "forward_ms": [8.0, 3.0, 4.6],
                 "backward_input_ms": [8.2, 2.9, 4.6], "backward_weight_ms": [3.4, 1.1, 1.5],
                 "p2p_ms": 0.89, "cross_pipeline_p2p_ms": 2.49, "allreduce_ms": 24.6, "optimizer_ms": 1.1,
                 "activation_mb": [1.7, 1.8, 1.0], "activation_w_mb": [0.42, 0.9, 0.25],
                 "memory_limit_mb": 3.2}

# Found by the falsification script of docs/notes/bounds.md section 8; CP-SAT proves 64.0 optimal.
THREE_BY_TWO = {"pipelines": 3, "stages": 2, "microbatches": 2, "forward_ms": [6.0, 4.0],
                "backward_input_ms": [4.0, 6.0], "backward_weight_ms": [3.0, 1.0], "p2p_ms": 1.0,
                "cross_pipeline_p2p_ms": 0.0, "allreduce_ms": 5.0, "optimizer_ms": 2.0,
                "activation_mb": 2.0, "activation_w_mb": 2.0, "memory_limit_mb": 3.0}


def cp_sat_unfloored(job: JobSpec, failed, deterministic_time: float) -> tuple[float, str]:
    """The best period of the heuristic plan and CP-SAT's full model from it, with the model's floor
    at 0 instead of the analytic bound (reproducible: deterministic time, one search worker)."""
    heuristic = plan(job, failed, use_cp=False)
    cp = cpsat.improve(job, tuple(heuristic.failed), heuristic.ops, heuristic.iteration_ms, 0.0, 60.0,
                       seed=1, deterministic_time=deterministic_time)
    best = heuristic.iteration_ms if cp.ops is None else replay(job, cp.ops).iteration_ms
    return best, cp.cp_status


def test_eight_workers_meet_seven_slots():
    """Stage 1 of pipeline 1 dead: 8 stage-0 workers (2.7 + 2.03 MB > 2.8: one micro-batch at a
    time, F to W) send their first micro-batches at once to 7 stage-1 workers holding one each
    (2 x 2.2 > 2.8). A stage-1 window [F start, B end] lasts >= 3.7 + 4.2 = 7.9 ms, so one stage-0
    worker's first micro-batch waits 7.9 ms for a slot. A worker on its own pipeline: two round
    trips of 5.2 + 0.82 + 7.9 + 0.82 + 5.0 + 3.0 = 22.74, all-reduce and optimizer 40.3: 85.78; late
    by 7.9: 93.68. The cut worker (two cross hops of 1.55: 88.7) late enters 7.9 + 0.82 - 1.55 = 7.17
    later than its own earliest: 95.87. Every worker serves two (three would take 108.5), so the
    cheapest late one is a worker on its own pipeline: 93.68 (bound 4 alone: 88.7; the 10 s plan
    94.4)."""
    job = JobSpec.parse(EIGHT_BY_TWO)
    wave = wave_bound(job, [(1, 1)])
    assert wave.value_ms == pytest.approx(85.78 + 7.9)
    assert "first and last waves at stage 0" in wave.reason
    assert lower_bound(job, [(1, 1)]).value_ms == pytest.approx(93.68)


def test_a_hand_worked_three_pipeline_job_and_cp_sat_above_it():
    """3 x 2 x 2, stage 1 of pipeline 2 dead, least hop 0 (cross hops are free): each stage-0 worker
    serves two, one round trip 6 + 4 + 6 + 4 + 3 = 23, tail 7: 53 ms; three workers, two slots, so
    one waits a stage-1 window (10): 63 ms. CP-SAT, floored at 0 instead of the bound, proves
    64.0."""
    job = JobSpec.parse(THREE_BY_TWO)
    assert wave_bound(job, [(2, 1)]).value_ms == pytest.approx(63.0)
    assert lower_bound(job, [(2, 1)]).value_ms == pytest.approx(63.0)
    best, status = cp_sat_unfloored(job, [(2, 1)], deterministic_time=20.0)
    assert (best, status) == (pytest.approx(64.0), "OPTIMAL")


def test_the_labels_go_where_they_cost_least():
    """2 x 2 x 1, stage 1 of pipeline 1 dead: two stage-0 workers, one slot at stage 1 (rest =
    F + B there = 5, least hop 1, cross 3, tail 7), so one late label and one early label. Pipeline
    0's worker: 5 + 1 + 5 + 1 + 2 + 1 = 15 per micro-batch, 22 with one, + 5 (a stage-1 window) per
    label: 27, 32. The cut one: 5 + 3 + 5 + 3 + 2 + 1 = 19, 26 with one, + 5 + 1 - 3 = 3 per label:
    29, 32. One label each: 29; both on one worker: 32; one worker serving both micro-batches: 37.
    So 29 (the first wave alone claimed 27). CP-SAT proves 34 optimal, and bound 2's round trip
    claims 32."""
    job = JobSpec.parse({"pipelines": 2, "stages": 2, "microbatches": 1, "forward_ms": [5.0, 2.0],
                         "backward_input_ms": [2.0, 3.0], "backward_weight_ms": [1.0, 5.0],
                         "p2p_ms": 1.0, "cross_pipeline_p2p_ms": 3.0, "allreduce_ms": 6.0,
                         "optimizer_ms": 1.0, "activation_mb": 2.0, "activation_w_mb": 2.0,
                         "memory_limit_mb": 3.0})
    assert wave_bound(job, [(1, 1)]).value_ms == pytest.approx(29.0)


def test_a_late_cut_worker_loses_only_what_its_cross_hop_does_not_already_cost():
    """3 x 2 x 2, stage 1 of pipelines 1 and 2 dead: three stage-0 workers one at a time, one slot
    at stage 1 (window F + B = 2), least hop 0, cross 3, tail 5. Pipeline 0's worker: 6 + 2 + 1 + 2
    = 11 per micro-batch, late by 2; a cut one 6 + 3 + 2 + 3 + 1 + 2 = 17, and late by 2 + 0 - 3 < 0,
    i.e. not at all: its first micro-batch enters stage 1 no earlier than the first window ends
    anyway. Two of the three are late, the cut ones for free: 3 + 2 + 1 micro-batches give
    max(38, 39, 22) = 39, which CP-SAT (floored at 0) proves optimal. Charging the cut workers the
    whole window would claim 40."""
    job = JobSpec.parse({"pipelines": 3, "stages": 2, "microbatches": 2, "forward_ms": [6.0, 1.0],
                         "backward_input_ms": [1.0, 1.0], "backward_weight_ms": [2.0, 1.0],
                         "p2p_ms": 0.0, "cross_pipeline_p2p_ms": 3.0, "allreduce_ms": 5.0,
                         "optimizer_ms": 0.0, "activation_mb": 2.0, "activation_w_mb": 1.5,
                         "memory_limit_mb": 2.0})
    failed = [(1, 1), (2, 1)]
    bound = wave_bound(job, failed).value_ms
    best, status = cp_sat_unfloored(job, failed, deterministic_time=20.0)
    assert (best, status) == (pytest.approx(39.0), "OPTIMAL")
    assert bound == pytest.approx(39.0)


def test_both_labels_on_one_worker_can_cost_less_than_one_on_each_of_two():
    """3 x 2 x 5, stage 1 of pipelines 0 and 1 dead: three stage-0 workers (one micro-batch at a
    time, W's may wait: 2 + 1 <= 3), one slot at stage 1, so two late labels and two early ones.
    A stage-1 window: F + B = 5; least hop 1, cross 3; the last W and the tail: 4 + 1 = 5.
    - Pipeline 2's worker: 1 + 4 + 5 + 2 x 1 = 12 a micro-batch, 12 n + 5, + 5 per label.
    - A cut worker: 1 + 4 + 5 + 2 x 3 = 16 a micro-batch, 16 n + 5, + 5 + 1 - 3 = 3 per label.
    At 87: pipeline 2's serves 6 with both labels (87), a cut one 5 with none (85) and 4 with one or
    two (72, 75). Pipeline 2's takes two labels and one cut worker the other two: 6 + 5 + 4 = 15,
    every micro-batch. One label on each cut worker would cover 14, and so would everything just
    below 87 (pipeline 2's with both labels serves 5 there): the bound is 87, not 88. (The round
    trip through stage 1's one worker, bound 2, is far above: 139.)"""
    job = JobSpec.parse({"pipelines": 3, "stages": 2, "microbatches": 5, "forward_ms": [1.0, 2.0],
                         "backward_input_ms": [4.0, 3.0], "backward_weight_ms": [4.0, 4.0],
                         "p2p_ms": 1.0, "cross_pipeline_p2p_ms": 3.0, "allreduce_ms": 1.0,
                         "optimizer_ms": 0.0, "activation_mb": 2.0, "activation_w_mb": 1.0,
                         "memory_limit_mb": 3.0})
    assert wave_bound(job, [(1, 1), (0, 1)]).value_ms == pytest.approx(87.0)


def test_the_last_wave_prices_a_second_late_worker():
    """Made-up 4 x 3 x 5 (seed 33), stage 1 of pipelines 1 and 3 dead. Stage 0 holds one
    micro-batch from F start to B end (2 x 1.7 > 3.2) and may leave its W's pending (1.7 + 0.42
    <= 3.2); stage 1 holds one (2 x 1.8 > 3.2): 2 slots for 4 workers, so two late labels and two
    early ones. A stage-1 window: 3 + 2.9 + 4.6 + 4.6 + 2 x 0.89 = 16.88.
    - Pipelines 0 and 2: 8 + 8.2 + 16.88 + 2 x 0.89 = 34.86 a micro-batch, five, then one W and the
      tail (3.4 + 24.6 + 1.1): 203.4; + 16.88 per label: 220.28, 237.16.
    - Pipelines 1 and 3 (cut, cross hops 2.49): 38.06 a micro-batch, five: 219.4 (bound 5's value);
      + 16.88 + 0.89 - 2.49 = 15.28 per label: 234.68.
    Below 234.68 a labelled cut worker serves four, and so does an own-pipeline worker with both
    labels, so any four labels lose two of the 20 micro-batches. The bound is 234.68; the 10 s plan
    reaches it (the first wave alone claims max(219.4, 220.28) = 220.28)."""
    job = JobSpec.parse(FOUR_BY_THREE)
    failed = [(3, 1), (1, 1)]
    wave = wave_bound(job, failed)
    assert wave.value_ms == pytest.approx(234.68)
    assert "first and last waves at stage 0" in wave.reason
    assert lower_bound(job, failed).value_ms == pytest.approx(234.68)


def test_a_worker_that_may_defer_its_w_is_chained_by_its_round_trips():
    """THREE_BY_TWO with activation_w 1 (2 + 1 <= 3: a W may wait beside the next F), stage 1 of
    pipeline 2 dead, least hop 0. A round trip is F + B at both stages, 6 + 4 + 4 + 6 = 20, so two
    take 40, then the last W (3) and the tail (7): 50. Three workers, two slots: one late label and
    one early label, 10 each: two workers at 60, or one at 70. A worker serving three would need 70,
    so 60, which CP-SAT (floored at 0) proves optimal."""
    job = JobSpec.parse({**THREE_BY_TWO, "activation_w_mb": 1.0})
    assert wave_bound(job, [(2, 1)]).value_ms == pytest.approx(60.0)
    best, status = cp_sat_unfloored(job, [(2, 1)], deterministic_time=20.0)
    assert (best, status) == (pytest.approx(60.0), "OPTIMAL")


@pytest.mark.parametrize(("change", "failed"), [
    ({"activation_mb": [2.0, 1.5], "activation_w_mb": [2.0, 1.0]}, [(2, 1)]),  # stage 1 holds two: 4 slots
    ({"activation_mb": [1.5, 2.0], "activation_w_mb": [1.0, 2.0]}, [(2, 1)]),  # stage 0 holds two
    ({}, [(2, 0)]),                                                            # 3 slots for 2
])
def test_it_does_not_apply_where_the_wave_fits_or_the_worker_overlaps(change, failed):
    job = JobSpec.parse({**THREE_BY_TWO, **change})
    assert wave_bound(job, failed).value_ms == 0.0


@st.composite
def wave_cases(draw):
    """Jobs where bound 7 applies somewhere: one activation at a time at two adjacent stages (2 MB
    each, limit 2-3 MB; a pending W that may or may not fit beside an F) and more dead workers at the
    lower one."""
    D, S, M = draw(st.integers(2, 5)), draw(st.integers(2, 3)), draw(st.integers(1, 3))
    whole = st.lists(st.integers(1, 6).map(float), min_size=S, max_size=S)
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": draw(whole),
            "backward_input_ms": draw(whole), "backward_weight_ms": draw(whole),
            "p2p_ms": float(draw(st.integers(0, 2))), "cross_pipeline_p2p_ms": float(draw(st.integers(0, 3))),
            "allreduce_ms": float(draw(st.integers(0, 6))), "optimizer_ms": float(draw(st.integers(0, 2))),
            "activation_mb": 2.0, "activation_w_mb": draw(st.sampled_from([0.5, 1.0, 1.5, 2.0])),
            "memory_limit_mb": draw(st.sampled_from([2.0, 3.0]))}
    s = draw(st.integers(0, S - 2))
    dead = draw(st.sets(st.integers(0, D - 1), min_size=1, max_size=D - 1))
    return JobSpec.parse(spec), [(p, s + 1) for p in sorted(dead)], draw(st.integers(0, 2**31))


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(wave_cases())
def test_no_random_valid_plan_beats_the_wave_bound(case):
    job, failed, seed = case
    periods = random_valid_periods(job, failed, seed, 25)
    assert periods, "no random plan completed"
    assert min(periods) >= wave_bound(job, failed).value_ms


@settings(max_examples=8, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(wave_cases())
def test_cp_sat_without_the_bound_never_beats_it(case):
    """CP-SAT's full model with its floor at 0 (not at the analytic bound), from the heuristic plan."""
    job, failed, _ = case
    best, _ = cp_sat_unfloored(job, failed, deterministic_time=1.0)
    bound = wave_bound(job, failed).value_ms
    assert best >= bound - 1e-9, (best, bound)
