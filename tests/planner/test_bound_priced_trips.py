"""Bound 4's priced round trips (`planner.bounds_sharing.priced_trips`, docs/notes/bounds.md section
4, "Priced trips"): a stage-s worker whose own next-stage worker cannot keep up sends the rest of its
micro-batches across pipelines, and those round trips are longer.

Hand-worked values first, then falsification on drawn jobs built for the case (a failure at stage s,
a heavier stage s + 1): random valid plans (tests/planner/random_plans.py, nothing of the planner's)
and a CP-SAT search must never beat the bound.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import strategies as st

from planner.bounds import lower_bound
from planner.bounds_sharing import sharing_bound
from planner.solve import plan
from planner.spec import JobSpec
from planner.validate import validate
from tests.planner.bound_falsification import (
    count_raised,
    cp_sat_not_below,
    no_random_plan_below,
    raised_cases,
    withholding,
)

PRICED = "priced round trips at stage 0"


def test_a_lone_worker_whose_own_next_stage_cannot_keep_up():
    """2 x 2 x 4, (0, 0) dead, hop 0, cross hop 3, 2 MB a micro-batch until its W ends, 5 MB: the lone
    stage-0 worker (1, 0) serves all 8 micro-batches, at most 2 windows [F start, W end] open at once.
    A window is F0 + F1 + B1 + B0 + W0 = 1 + 2 + 2 + 1 + 1 = 7 ms when (1, 1) serves it, 7 + 2 x 3 = 13
    when (0, 1) does. With a served by (1, 1): P >= (7 a + 13 (8 - a)) / 2 = 52 - 3 a. But (1, 1)
    spends F + B + W = 6 ms on each: a <= P / 6. a = 5: max(30, 37) = 37; a = 6: max(36, 34) = 36;
    a = 7: 42. The bound is 36. Every trip priced at 7 gives (8 x 7) / 2 = 28; the bounds before the
    pricing said 31 (bound 3, memory-time at stage 0), and the pricing without the window term 34."""
    job = JobSpec.parse({
        "pipelines": 2, "stages": 2, "microbatches": 4, "forward_ms": [1.0, 2.0],
        "backward_input_ms": [1.0, 2.0], "backward_weight_ms": [1.0, 2.0], "p2p_ms": 0.0,
        "cross_pipeline_p2p_ms": 3.0, "allreduce_ms": 0.0, "optimizer_ms": 0.0, "activation_mb": 2.0,
        "activation_w_mb": 2.0, "memory_limit_mb": 5.0})
    bound = lower_bound(job, [(0, 0)])
    assert bound.value_ms == 36.0
    assert bound.reason.startswith(PRICED)
    result = plan(job, [(0, 0)], use_cp=False)
    assert validate(job, result.failed, result.ops) == []
    assert result.iteration_ms >= 36.0


def test_made_up_2x2x15_with_stage_0_of_pipeline_0_dead():
    """`benchmarks/gap_unseen.py --jobs 2 --sets 3 --seed 23`, the second job: (1, 0) serves all 30
    micro-batches. Its windows [F start, W end] hold 2.7 MB each, floor(7 / 2.7) = 2 at once: 2.3 +
    0.8 + 4.2 + 4.2 + 0.8 + 2.3 + 1.2 = 15.8 ms through (1, 1), 2.6 more through (0, 1) (cross 2.1
    against hop 0.8, both ways). (1, 1) spends 4.2 + 4.2 + 2.2 = 10.6 ms a micro-batch, and every
    worker ends its period with all-reduce + optimizer, 15 ms. With a through (1, 1):
    P >= 15 + max(10.6 a, (15.8 a + 18.4 (30 - a)) / 2); a = 23: max(243.8, 246.1), 261.1;
    a = 22: 15 + 247.4; a = 24: 15 + 254.4. The older bounds said 257.8 (memory-time at stage 0).
    Bound 12 (bound 6's recurrence priced the same way, `planner.bounds_priced`) raises the job's
    bound above it (263.55); bound 4 keeps its own value."""
    job = JobSpec.parse({
        "pipelines": 2, "stages": 2, "microbatches": 15, "forward_ms": [2.3, 4.2],
        "backward_input_ms": [2.3, 4.2], "backward_weight_ms": [1.2, 2.2], "p2p_ms": 0.8,
        "cross_pipeline_p2p_ms": 2.1, "allreduce_ms": 14.0, "optimizer_ms": 1.0,
        "activation_mb": [2.7, 3.5]})
    bound = sharing_bound(job, [(0, 0)])
    assert bound.value_ms == pytest.approx(261.1, abs=1e-9)
    assert bound.reason.startswith(PRICED)
    assert lower_bound(job, [(0, 0)]).value_ms >= bound.value_ms


def test_no_pricing_when_the_next_stage_keeps_up():
    """The first job with stage 1 light (1 ms each op): the lone (1, 0) needs 25 ms anyway (8 x 3 ms
    of work and 1 ms waiting for its first gradient), and in 25 ms (1, 1), at 3 ms a micro-batch,
    serves all 8: the pricing adds nothing, and the bound is what the older bounds say."""
    light = {"pipelines": 2, "stages": 2, "microbatches": 4, "forward_ms": 1.0, "backward_input_ms": 1.0,
             "backward_weight_ms": 1.0, "p2p_ms": 0.0, "cross_pipeline_p2p_ms": 3.0, "allreduce_ms": 0.0,
             "optimizer_ms": 0.0, "activation_mb": 2.0, "activation_w_mb": 2.0, "memory_limit_mb": 5.0}
    job = JobSpec.parse(light)
    assert not sharing_bound(job, [(0, 0)]).reason.startswith(PRICED)


def drawn_priced_case(rng: random.Random):
    """A small job with some workers of stage s dead and stage s + 1 heavier, little memory: the lone
    survivors' own next-stage workers cannot take every round trip. Whole milliseconds."""
    D, S, M = rng.randint(2, 3), rng.randint(2, 3), rng.randint(2, 4)
    s = rng.randrange(S - 1)

    def times():
        return [float(rng.randint(3, 6) if t == s + 1 else rng.randint(1, 2)) for t in range(S)]
    job = JobSpec.parse({
        "pipelines": D, "stages": S, "microbatches": M, "forward_ms": times(),
        "backward_input_ms": times(), "backward_weight_ms": times(), "p2p_ms": float(rng.randint(0, 1)),
        "cross_pipeline_p2p_ms": float(rng.randint(2, 4)), "allreduce_ms": float(rng.randint(0, 3)),
        "optimizer_ms": float(rng.randint(0, 1)), "activation_mb": 2.0,
        "activation_w_mb": rng.choice([0.0, 1.0, 2.0]),
        "memory_limit_mb": rng.choice([2.0, 3.0, 4.0, 5.0, 7.0])})
    dead = rng.sample(range(D), rng.randint(1, D - 1))
    return job, sorted((p, s) for p in dead), rng.randrange(2**31)


priced_cases = st.integers(0, 2**31).map(lambda seed: drawn_priced_case(random.Random(seed)))


def keeps_bound_4(job, dead, s, hop, kinds, base: float, floor: float = 0.0) -> float:
    """`planner.bounds_sharing.priced_trips` withheld (its stand-in, here and in the falsification
    scripts): each stage keeps bound 4's own value, its `base`."""
    return base


def raised(monkeypatch):
    """Whether the full bound is above the bound with the priced trips withheld."""
    import planner.bounds_sharing

    return withholding(planner.bounds_sharing, "priced_trips", keeps_bound_4, monkeypatch)


def test_the_drawn_cases_exercise_the_pricing(monkeypatch):
    """The falsification below means something only if the pricing raises many of its cases."""
    raised_count = count_raised(drawn_priced_case, raised(monkeypatch), 60)
    assert raised_count >= 8, raised_count


def test_no_random_valid_plan_beats_a_bound_the_pricing_raised(monkeypatch):
    """The first 12 drawn cases whose bound the pricing raises, 40 random valid plans each."""
    no_random_plan_below(raised_cases(drawn_priced_case, raised(monkeypatch), 12, 200))


def test_cp_sat_never_beats_a_bound_the_pricing_raised(monkeypatch):
    """The first 6 drawn cases whose bound the pricing raises: CP-SAT's full model (free routing)
    given 3 s from the heuristic plan, with its floor at 0 rather than at the bound."""
    cp_sat_not_below(raised_cases(drawn_priced_case, raised(monkeypatch), 6, 200))


def test_a_floor_only_skips_what_it_already_proves():
    """`lower_bound` passes bounds 1-3 as `floor_ms`, and the pricing is searched only where it could
    pass it: whatever the floor, max(floor, bound with it) must equal max(floor, bound without it)."""
    checked = 0
    for seed in range(40):
        job, failed, _ = drawn_priced_case(random.Random(seed))
        exact = sharing_bound(job, failed).value_ms
        for floor in (exact - 1.0, exact - 1e-6, exact, exact + 3.0):
            assert max(floor, sharing_bound(job, failed, floor_ms=floor).value_ms) == max(floor, exact)
        checked += sharing_bound(job, failed).reason.startswith("priced")
    assert checked >= 5  # and among them, cases the pricing itself decides
