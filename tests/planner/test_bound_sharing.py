"""Bound 4 (`planner.bounds_sharing`, docs/notes/bounds.md section 4): a stage's micro-batches shared
among workers that are not alike, because a failure cut some of them from the next stage.

Hand-worked values first (F = B = W = 1 ms, no same-pipeline hop, activation = activation_w = limit:
one micro-batch at a time, so a worker's time per micro-batch is its whole round trip), then
falsification: random valid plans (tests/planner/random_plans.py, nothing of the planner's) and a
CP-SAT search must never beat the bound on jobs built to have cut workers.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from planner.bounds import lower_bound
from planner.bounds_sharing import sharing_bound
from planner.solve import plan
from planner.spec import JobSpec
from planner.validate import validate
from tests.planner.test_bound_priced_trips import priced_cases
from tests.planner.test_bound_soundness import random_valid_periods

ONE_AT_A_TIME = dict(forward_ms=1.0, backward_input_ms=1.0, backward_weight_ms=1.0, p2p_ms=0.0,
                     allreduce_ms=0.0, optimizer_ms=0.0, activation_mb=2.0, activation_w_mb=2.0,
                     memory_limit_mb=2.0)


def test_cut_worker_too_slow_to_help():
    """3 x 2 x 2, worker [2, 1] dead, cross-pipeline hop 2 ms. Stage 0 has 6 micro-batches and three
    workers. [0, 0] and [1, 0] spend F + (F + B at stage 1) + B + W = 5 ms per micro-batch; the cut
    [2, 0] crosses twice, 9 ms. In 10 ms the three serve 2 + 2 + 1 = 5 < 6; in 15 ms, 3 + 3 + 1:
    the bound is 15 (the even split, 2 each, priced the cut worker's 18 ms only as a busiest worker
    it is not; the older bounds said 10). Dropping pipeline 2 reaches 15: the optimum."""
    job = JobSpec.parse({**ONE_AT_A_TIME, "pipelines": 3, "stages": 2, "microbatches": 2,
                         "cross_pipeline_p2p_ms": 2.0})
    bound = lower_bound(job, [(2, 1)])
    assert bound.value_ms == 15.0
    assert bound.reason.startswith("sharing at stage 0: 1 of 3 workers cut")
    result = plan(job, [(2, 1)], use_cp=False)
    assert validate(job, [(2, 1)], result.ops) == []
    assert result.iteration_ms == 15.0


def test_cut_worker_slower_but_helping():
    """The same with a 1 ms cross hop: the cut worker takes 7 ms per micro-batch. Round trips end
    at 5, 5, 7, 10, 10, 14, 15, ...; the sixth smallest is 14 (2 + 2 + 2 micro-batches)."""
    job = JobSpec.parse({**ONE_AT_A_TIME, "pipelines": 3, "stages": 2, "microbatches": 2,
                         "cross_pipeline_p2p_ms": 1.0})
    assert sharing_bound(job, [(2, 1)]).value_ms == 14.0
    assert plan(job, [(2, 1)], use_cp=False).iteration_ms >= 14.0


def test_no_cut_worker_no_sharing_term():
    """With the failure at stage 0 nobody is cut from stage 1, so only the even split is priced:
    stage 0's 6 micro-batches on its 2 workers, 3 x 5 ms one at a time = 15 ms."""
    job = JobSpec.parse({**ONE_AT_A_TIME, "pipelines": 3, "stages": 2, "microbatches": 2,
                         "cross_pipeline_p2p_ms": 2.0})
    bound = sharing_bound(job, [(2, 0)])
    assert not bound.reason.startswith("sharing")
    assert bound.value_ms == 15.0  # stage 0: 6 micro-batches on 2 workers, 3 x 5 ms


def test_a_cut_worker_pays_its_cross_hops_in_fill_and_drain():
    """Made-up 7 x 2 x 12 (`benchmarks/gap_unseen.py --seed 3`, #8), stage 1 of pipelines 0, 2, 4
    dead: stage 0 (F 6.5, B 6.1, W 2.2: 14.8 per micro-batch) serves 84 on 7 workers, 2 held at
    once (2.8 of 5.6 MB, W frees all). A cut worker's round trip below it is 2.8 + 3.1 + 2 x 2.76
    (cross) = 11.42: before its first B it fills 2 x 6.5 of 6.5 + 11.42 (4.92 idle), and after its
    last F it holds one other micro-batch, B + W = 8.3 of 11.42 (3.12 idle): with 12 it needs
    12 x 14.8 + 8.04 + 11.3 + 0.6 = 197.54. The others (chain 5.9 + 2 x 0.19) idle none: 189.5
    with 12, 204.3 with 13. Below 197.54 the cut ones serve 11 (182.74) and the others 12, 81 < 84.
    Without the idle the cut ones' 12 cost 189.5 too, the bound said."""
    job = JobSpec.parse({
        "pipelines": 7, "stages": 2, "microbatches": 12, "forward_ms": [6.5, 2.8],
        "backward_input_ms": [6.1, 3.1], "backward_weight_ms": [2.2, 1.0], "p2p_ms": 0.19,
        "cross_pipeline_p2p_ms": 2.76, "allreduce_ms": 11.3, "optimizer_ms": 0.6,
        "activation_mb": [2.8, 1.0], "activation_w_mb": [2.8, 1.0], "memory_limit_mb": 5.6})
    failed = [(0, 1), (2, 1), (4, 1)]
    bound = sharing_bound(job, failed)
    assert bound.value_ms == pytest.approx(197.54, abs=1e-9)
    assert bound.reason.startswith("sharing at stage 0: 3 of 7 workers cut")
    assert lower_bound(job, failed).value_ms == pytest.approx(197.54, abs=1e-9)
    result = plan(job, failed, use_cp=False)
    assert validate(job, result.failed, result.ops) == []
    assert result.iteration_ms >= 197.54


whole = st.integers(1, 4).map(float)


@st.composite
def cut_cases(draw):
    """Small jobs where a failure at stage s + 1 leaves (p, s) alive, with little memory."""
    D, S, M = draw(st.integers(2, 3)), draw(st.integers(2, 3)), draw(st.integers(1, 3))
    per = st.one_of(whole, st.lists(whole, min_size=S, max_size=S))
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": draw(per),
            "backward_input_ms": draw(per), "backward_weight_ms": draw(per),
            "p2p_ms": draw(st.integers(0, 1).map(float)),
            "cross_pipeline_p2p_ms": draw(st.integers(0, 4).map(float)),
            "allreduce_ms": draw(st.integers(0, 3).map(float)),
            "optimizer_ms": draw(st.integers(0, 1).map(float)),
            "activation_mb": 2.0, "activation_w_mb": draw(st.sampled_from([0.0, 1.0, 2.0])),
            "memory_limit_mb": draw(st.sampled_from([2.0, 3.0, 4.0, 6.0]))}
    job = JobSpec.parse(spec)
    s = draw(st.integers(1, S - 1))
    dead = draw(st.sets(st.integers(0, D - 1), min_size=1, max_size=D - 1))
    return job, sorted((p, s) for p in dead), draw(st.integers(0, 2**31))


@settings(max_examples=100, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.one_of(cut_cases(), priced_cases))
def test_no_random_valid_plan_beats_the_sharing_bound(case):
    """On jobs with cut workers, and on jobs whose survivors' own next stage cannot keep up (the
    priced trips, tests/planner/test_bound_priced_trips.py)."""
    job, failed, seed = case
    bound = lower_bound(job, failed).value_ms
    # Mostly at home: a cut worker then serves many micro-batches, the case bound 4 prices, and an
    # uncut one leans on its own next stage, the case the pricing caps.
    periods = random_valid_periods(job, failed, seed, 30,
                                   stay_home=lambda rng: rng.choice([0.5, 0.6, 0.8, 0.9, 1.0]))
    assert periods
    assert min(periods) >= bound, (min(periods), bound)


@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cut_cases())
def test_cp_sat_never_beats_the_sharing_bound(case):
    from planner.cp import cpsat

    job, failed, _ = case
    hint = plan(job, failed, use_cp=False)
    canonical = list(hint.canonical.failed)
    start = plan(job, canonical, use_cp=False)
    found = cpsat.improve(job, tuple(canonical), start.ops, start.iteration_ms + 1.0, 0.0, 3.0, seed=3)
    best = start.iteration_ms if found.ops is None else min(start.iteration_ms, found.period_ms)
    assert best >= sharing_bound(job, canonical).value_ms


def test_cut_worker_share_is_what_the_bound_leaves_it():
    """The hand-worked jobs above: at 15 ms the 9 ms cut worker serves 1 micro-batch; at 14 ms the
    7 ms one serves 2."""
    from planner.bounds_sharing import cut_worker_shares

    slow = JobSpec.parse({**ONE_AT_A_TIME, "pipelines": 3, "stages": 2, "microbatches": 2,
                          "cross_pipeline_p2p_ms": 2.0})
    fast = JobSpec.parse({**slow.filled(), "cross_pipeline_p2p_ms": 1.0})
    assert cut_worker_shares(slow, [(2, 1)]) == [1]
    assert cut_worker_shares(fast, [(2, 1)]) == [2]
    assert cut_worker_shares(slow, [(2, 0)]) == []  # nobody cut


MEMORY_BOUND_JOB = {  # benchmarks/gap_unseen.py job #4: one stage-0 micro-batch in memory at a time
    "pipelines": 8, "stages": 2, "microbatches": 23, "forward_ms": [3.3, 3.3],
    "backward_input_ms": [3.7, 3.5], "backward_weight_ms": [1.0, 2.6], "p2p_ms": 0.91,
    "cross_pipeline_p2p_ms": 2.75, "allreduce_ms": 37.1, "optimizer_ms": 3.4,
    "activation_mb": [2.6, 1.4], "activation_w_mb": [1.95, 0.7], "memory_limit_mb": 3.8}


def test_the_search_keeps_the_share_bound_4_suggests(monkeypatch):
    """Three stage-1 failures cut three stage-0 workers, each of which can serve 20 of its 23
    micro-batches in the bound's period: the mix keeping 20 beats every other candidate (the
    re-routing paper-style plan, fixed-fraction mixes, dissolving, dropping). keep=20 is also one
    of the nearly whole mixes (M-1 .. M-4), which reach the same plan on their own: the share is
    isolated with those off, and the two routes must agree."""
    import planner.candidates

    job = JobSpec.parse(MEMORY_BOUND_JOB)
    failed = [(1, 1), (2, 1), (3, 1)]
    both = plan(job, failed, use_cp=False, time_limit_s=1e6)
    monkeypatch.setattr(planner.candidates, "NEAR_WHOLE_KEEPS", 0)
    with_share = plan(job, failed, use_cp=False, time_limit_s=1e6)
    assert validate(job, with_share.failed, with_share.ops) == []
    assert with_share.stats.heuristic_policy.startswith("mix(keep=20)")
    monkeypatch.setattr(planner.candidates, "cut_worker_shares", lambda job, failed: [])
    without = plan(job, failed, use_cp=False, time_limit_s=1e6)
    assert with_share.iteration_ms < without.iteration_ms - 1.0
    assert both.iteration_ms <= with_share.iteration_ms + 1e-9


def test_rounding_never_makes_the_bound_infinite():
    """Found by benchmarks/planner_fuzz.py (seed 23): 3 x 4 x 1 with stage 3 down to one worker. Each
    stage-0 worker can hold all three micro-batches, so its round-trip term is 3 x r / 3, one ulp
    below r = 30.21 ms, while 1 and 2 micro-batches gave r exactly. The count search, which needs g
    non-decreasing, then found no worker able to serve even one micro-batch at g(3), and bound 4 said
    infinity: above every plan, and `plan` called its plan optimal. The round trip alone is 30.21 ms
    here, so the stage's least period is that."""
    job = JobSpec.parse({
        "pipelines": 3, "stages": 4, "microbatches": 1, "forward_ms": [1.34, 0.64, 2.88, 1.9],
        "backward_input_ms": 4.44, "backward_weight_ms": [0.66, 4.34, 0.63, 2.2],
        "p2p_ms": [0.51, 0.43, 0.5, 0.8], "allreduce_ms": [1.71, 2.48, 4.67, 1.27],
        "optimizer_ms": [0.6, 0.1, 1.01, 1.23], "activation_mb": 2.73})
    failed = [(1, 3), (0, 3)]
    assert sharing_bound(job, failed).value_ms < 40.0
    result = plan(job, failed, use_cp=False)
    assert validate(job, result.failed, result.ops) == []
    assert lower_bound(job, failed).value_ms <= result.iteration_ms + 1e-9


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(st.lists(st.floats(0.01, 50.0), min_size=3, max_size=3), st.floats(0.0, 50.0),
       st.integers(1, 40), st.integers(1, 200), st.floats(0.0, 20.0), st.integers(0, 60),
       st.sampled_from([1.0, 0.7, 0.0]))
# Found by a random run (2026-11-27): 5 x extra / 5 was one ulp below 4 x extra / 4.
@example([1.0, 1.0, 1.0], 0.0, 5, 5, 12.885043060092876, 0, 1.0)
def test_per_worker_bound_never_decreases(times, chain, holds_n, total, extra, own, activation_w):
    """g(n) is compared exactly against periods, so it must not dip by a rounding error anywhere;
    nor g(n, own) (priced trips: all but `own` round trips `extra` longer), which must also not
    fall when fewer trips stay at home."""
    from planner.bounds_sharing import per_worker_bound

    f, b, w = times
    job = JobSpec.parse({"pipelines": 1, "stages": 1, "microbatches": 1, "forward_ms": f,
                         "backward_input_ms": b, "backward_weight_ms": w, "p2p_ms": 0.0,
                         "allreduce_ms": 0.0, "optimizer_ms": 0.0, "activation_mb": 1.0,
                         "activation_w_mb": activation_w, "memory_limit_mb": float(holds_n)})
    g = per_worker_bound(job.costs, 0, chain, total, extra)
    for values in ([g(n) for n in range(1, total + 1)], [g(n, own) for n in range(1, total + 1)]):
        assert all(x <= y for x, y in zip(values, values[1:], strict=False))
    assert all(g(n, own) <= g(n, max(0, own - 1)) for n in range(1, total + 1))


def test_a_worker_whose_pipeline_lost_a_lower_stage_crosses_pipelines_on_the_way():
    """6 x 3 x 5, (0, 0) and (2, 2) dead. Stage 0 runs one micro-batch at a time (3 + 2 MB > 4):
    per micro-batch 4 + 4.2 + 2 + 0.3 + 3.5 + 3.9 + 0.3 + 5 + 5.5 + 0.3 + 0.3 = 29.3 on its own
    pipeline, tail 13.5, and five workers for 30 micro-batches: six each, 189.3 (bound 4 as it was).
    But (2, 0) has no stage 2 on its pipeline: each of its micro-batches goes to another pipeline
    somewhere on the way down and its gradient comes back across too, 2 x (1.4 - 0.3) = 2.2 more:
    6 x 31.5 + 13.5 = 202.5 with six, and with five the others need seven (7 x 29.3 + 13.5 =
    218.6). The planner's heuristic reaches 202.5: proven optimal."""
    job = JobSpec.parse({"pipelines": 6, "stages": 3, "microbatches": 5, "forward_ms": [4.0, 3.5, 5.0],
                         "backward_input_ms": [4.2, 3.9, 5.5], "backward_weight_ms": [2.0, 3.0, 1.5],
                         "p2p_ms": 0.3, "cross_pipeline_p2p_ms": 1.4, "allreduce_ms": 12.0,
                         "optimizer_ms": 1.5, "activation_mb": [3.0, 2.5, 2.0],
                         "activation_w_mb": [2.0, 1.0, 1.0], "memory_limit_mb": 4.0})
    failed = [(0, 0), (2, 2)]
    assert sharing_bound(job, failed).value_ms == pytest.approx(202.5)
    assert lower_bound(job, failed).value_ms == pytest.approx(202.5)
    heuristic = plan(job, failed, use_cp=False)
    assert not validate(job, heuristic.failed, heuristic.ops)
    assert heuristic.iteration_ms == pytest.approx(202.5)
