"""planner/zb_greedy.py against Zero Bubble's own code, and the fault-free plan never behind it.

The reference is ZB's heuristic ported verbatim (benchmarks/zb_reference/zb_heuristic.py, loaded by
path): an independent implementation of the same rules. With our extension off (early_stages=0)
every variant must give exactly ZB's op times; every schedule the candidates produce must pass the
validator; and the planner's fault-free search must never end above ZB's best period.
"""

from __future__ import annotations

import sys
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.candidates import best_heuristic
from planner.simulator import replay
from planner.spec import JobSpec
from planner.validate import validate
from planner.zb_greedy import VARIANTS, overrun_threshold, zb_greedy_candidates, zb_greedy_schedule

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # benchmarks/ is not a package
from benchmarks.zb_reference.adapter import times_to_ops, variant_times  # noqa: E402

ms = st.integers(min_value=2, max_value=40).map(lambda x: x / 2)  # 1.0 .. 20.0 in 0.5 steps


@st.composite
def zb_jobs(draw) -> JobSpec:
    S = draw(st.integers(2, 8))
    M = draw(st.integers(S, 3 * S))
    factor = draw(st.sampled_from([1, 2]))  # 1F1B memory (S micro-batches) or twice it
    return JobSpec.parse(dict(
        pipelines=1, stages=S, microbatches=M, forward_ms=draw(ms), backward_input_ms=draw(ms),
        backward_weight_ms=draw(ms), p2p_ms=draw(st.sampled_from([0.0, 0.25, 1.0])), allreduce_ms=0.0,
        optimizer_ms=0.0, activation_mb=1.0, activation_w_mb=draw(st.sampled_from([1.0, 0.5, 0.25])),
        memory_limit_mb=float(factor * S)))


def reference_best_period(job: JobSpec) -> float:
    """ZB's own schedules (their code), replayed and validated by the planner's rules."""
    best = float("inf")
    for variant in VARIANTS:
        try:
            ops = times_to_ops(job, variant_times(job, variant))
        except (ValueError, AssertionError):
            continue  # ZB's code refuses this variant ("Cannot fit memory" or its own checks)
        if not validate(job, (), ops):
            best = min(best, replay(job, ops).iteration_ms)
    return best


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(zb_jobs(), st.sampled_from(VARIANTS))
def test_same_times_as_zero_bubbles_code(job, variant):
    ours = zb_greedy_schedule(job, *variant)
    try:
        times = variant_times(job, variant)
    except (ValueError, AssertionError):  # ZB refuses the variant ("Cannot fit memory", its checks)
        assert ours is None
        return
    if ours is None:  # we refuse only what breaks a rule: ZB's schedule must then be invalid
        assert validate(job, (), times_to_ops(job, times)) != []
        return
    S, M = job.stages, job.microbatches
    for op in ours:
        if op.kind in ("F", "B", "W"):
            node = "FBW".index(op.kind) * S * M + op.worker[1] * M + op.microbatch[1]
            assert abs(op.end_ms - times[node]) < 1e-6, (op, times[node])


@settings(max_examples=30, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(zb_jobs())
def test_every_candidate_is_valid(job):
    produced = 0
    for ops, name in zb_greedy_candidates(job):
        if ops is not None:
            produced += 1
            assert validate(job, (), ops) == [], name
    assert produced > 0  # ZB's variants always include one that schedules these jobs


@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(zb_jobs())
def test_fault_free_search_never_behind_zero_bubble(job):
    _, period, _ = best_heuristic(job, (), 0.0, budget_s=float("inf"))
    assert period <= reference_best_period(job) + 1e-6


def test_early_forward_fills_the_first_b_wait():
    """Hand-checked on the 6.2B profile at twice 1F1B memory, W share 0.5 (benchmarks/vs_zero_bubble.py):
    ZB's best is 1901.32 ms; one more warm-up forward on stages 0-3 gives 1898.28 ms."""
    job = JobSpec.parse(dict(pipelines=1, stages=8, microbatches=24, forward_ms=29.7, backward_input_ms=29.4,
                             backward_weight_ms=19.9, p2p_ms=0.53, allreduce_ms=0.0, optimizer_ms=0.0,
                             activation_mb=1.0, activation_w_mb=0.5, memory_limit_mb=16.0))
    assert abs(reference_best_period(job) - 1901.32) < 1e-6
    early = zb_greedy_schedule(job, True, False, False, early_stages=4)
    assert validate(job, (), early) == []
    assert abs(replay(job, early).iteration_ms - 1898.28) < 1e-6


def test_per_stage_overrun_beats_both_zero_bubble_warmups_on_the_28b_profile():
    """Hand-derived on the 28.3B profile (p 32, m 96, F 10.4, B 10.2, W 7.7, hop 0.41) at twice 1F1B
    memory, W share 0.5. Stage s = 31 - k gets its first F at 10.81 s and the first B back
    F + k (F + B + 2 hop) = 10.4 + 21.42 k after it: 2k + 1 forwards plus a wait of 0.62 k modulo
    10.4 (stage 0: 64 forwards, its memory, and 8.82). The largest, 9.92 at k = 16 (stage 15),
    sets ZB's period: 96 x 28.3 + 9.92 = 2726.72. Overrunning there alone (34 forwards, the first
    B 0.48 later for stages 0-14) leaves the memory-bound stage 0 the largest wait,
    8.82 + 0.48 = 9.30: 2726.10. Overrunning at stage 0 too is impossible (memory), so a lower
    threshold only adds delay."""
    job = JobSpec.parse(dict(
        pipelines=1, stages=32, microbatches=96, forward_ms=10.4, backward_input_ms=10.2,
        backward_weight_ms=7.7, p2p_ms=0.41, allreduce_ms=0.0, optimizer_ms=0.0, activation_mb=1.0,
        activation_w_mb=0.5, memory_limit_mb=64.0))
    threshold = overrun_threshold(job)
    assert threshold is not None and 9.30 < threshold < 9.92
    for bubble_before_first_b in (True, False):  # ZB's two warm-ups, its best other flags
        zb = zb_greedy_schedule(job, bubble_before_first_b, False, False)
        assert replay(job, zb).iteration_ms > 2726.72 - 1e-6
    ops = zb_greedy_schedule(job, True, False, False, overrun_above=threshold)
    assert validate(job, (), ops) == []
    assert abs(replay(job, ops).iteration_ms - 2726.10) < 1e-6
