"""Bound 4 with bound 6's recurrence per kind of worker (`planner.bounds_sharing`, the "paced"
term): a stage's micro-batches shared among survivors some of which are cut from the stage below,
each kind's count priced by the recurrence at its own round trip.

A made-up case first (the covering worked by hand from bound 6's values), then falsification on
drawn jobs built for it: random valid plans (tests/planner/random_plans.py) and a CP-SAT search must
never beat the bound.
"""

from __future__ import annotations

import random

import pytest

import planner.bounds_sharing as sharing
from planner.bounds import chain_below, holds, lower_bound, paced_stage, paced_w_ends, stage_hops
from planner.spec import JobSpec
from tests.planner.bound_falsification import (
    cp_sat_not_below,
    no_random_plan_below,
    raised_cases,
    withholding,
)


def test_made_up_7x6x23_spread_with_three_survivors_cut_below():
    """Fresh seed 63's second job (`benchmarks/gap_unseen.py --seed 63`), spread [(0, 3), (3, 2),
    (5, 1), (6, 0)]: stage 0 keeps six workers for 161 micro-batches, three of them ((0, 0), (3, 0),
    (5, 0)) with a dead stage below on their own pipeline, so every round trip of theirs crosses
    pipelines somewhere: 2 x (2.6 - 0.91) = 3.38 ms longer. Each holds 3 micro-batches (3 x 3.5
    MB of 11.2). Bound 6's recurrence for one worker: 27 micro-batches (nine
    groups of three) 698.0 ms at the own round trip, 728.42 at the crossing one; a 28th needs a
    tenth group: 759.4 and 793.2; 26 crossing: 722.42. Below 728.42 the cut three serve at most 26
    each and the others 27: 159 < 161. So P >= 728.42 (bound 4 without the recurrence: 702.13; the
    busiest worker's own recurrence: 698.0)."""
    job = JobSpec.parse({
        "pipelines": 7, "stages": 6, "microbatches": 23, "forward_ms": [2.6, 6.0, 6.6, 5.3, 7.3, 3.3],
        "backward_input_ms": [2.4, 6.1, 7.5, 6.1, 6.8, 3.3],
        "backward_weight_ms": [1.0, 2.0, 3.1, 2.0, 5.4, 2.8], "p2p_ms": 0.91,
        "cross_pipeline_p2p_ms": 2.6, "allreduce_ms": 22.5, "optimizer_ms": 2.9,
        "activation_mb": [3.5, 3.6, 3.4, 1.6, 3.3, 3.0],
        "activation_w_mb": [1.75, 0.9, 0.85, 0.8, 2.47, 2.25], "memory_limit_mb": 11.2})
    failed = [(0, 3), (3, 2), (5, 1), (6, 0)]
    costs = job.costs
    k = holds(costs, 0, 161)
    own = costs.forward[0] + chain_below(costs, stage_hops(costs, 6), 0) + costs.backward_input[0]
    tail = costs.allreduce[0] + costs.optimizer[0]

    def recurrence(n: int, trip: float) -> float:
        return paced_stage(costs, 0, n, k, trip).last_w_end + tail

    assert k == 3
    assert recurrence(27, own) == pytest.approx(698.0) and recurrence(28, own) == pytest.approx(759.4)
    assert recurrence(26, own + 3.38) == pytest.approx(722.42)
    assert recurrence(27, own + 3.38) == pytest.approx(728.42)
    bound = lower_bound(job, failed)
    assert bound.value_ms == pytest.approx(728.42)
    assert bound.reason.startswith("sharing at stage 0")


def shared_paced_case(rng: random.Random):
    """A small job whose stage s has survivors cut from stage s + 1 (their own worker there dead),
    cheap and holding two or three micro-batches, with five to ten micro-batches a pipeline so that
    the recurrence's whole groups show. Whole milliseconds."""
    D, S, M = rng.randint(2, 4), rng.randint(2, 3), rng.randint(5, 10)
    s = rng.randrange(S - 1)

    def times():
        return [float(rng.randint(1, 3)) for _ in range(S)]
    p2p = float(rng.randint(0, 1))
    job = JobSpec.parse({
        "pipelines": D, "stages": S, "microbatches": M, "forward_ms": times(),
        "backward_input_ms": times(), "backward_weight_ms": times(), "p2p_ms": p2p,
        "cross_pipeline_p2p_ms": p2p + rng.randint(1, 3), "allreduce_ms": float(rng.randint(0, 3)),
        "optimizer_ms": float(rng.randint(0, 1)), "activation_mb": 2.0,
        "activation_w_mb": rng.choice([0.0, 1.0, 2.0]),
        "memory_limit_mb": rng.choice([4.0, 5.0, 6.0, 7.0])})
    cut = rng.sample(range(D), rng.randint(1, D - 1))
    return job, sorted((p, s + 1) for p in cut), rng.randrange(2**31)


def raised(monkeypatch):
    """Whether the full bound is above the bound with bound 4's recurrence term withheld (the
    per-worker caches emptied around each, so the withheld run computes its terms afresh)."""
    return withholding(sharing, "paced_w_ends", lambda costs, s, n, *_: [0.0] * (n + 1), monkeypatch,
                       forget=sharing.forget)


def test_no_random_valid_plan_beats_a_bound_the_recurrence_raised(monkeypatch):
    """The first 8 drawn cases (of 400) whose bound the recurrence term raises, 40 random valid
    plans each."""
    no_random_plan_below(raised_cases(shared_paced_case, raised(monkeypatch), 8, 400))


def test_cp_sat_never_beats_a_bound_the_recurrence_raised(monkeypatch):
    """The first 4 of them against CP-SAT's full model floored at 0, 3 s from the heuristic plan."""
    cp_sat_not_below(raised_cases(shared_paced_case, raised(monkeypatch), 4, 400))


def test_one_run_gives_every_count():
    """Second method for `paced_w_ends`: its value for every m equals bound 6's recurrence run for m
    on its own (`paced_stage`), on drawn stage costs, memory and round trips (whole milliseconds, so
    the comparison is exact)."""
    rng = random.Random(7)
    compared = 0
    for _ in range(60):
        f, b, w = (float(rng.randint(1, 4)) for _ in range(3))
        job = JobSpec.parse({
            "pipelines": 1, "stages": 2, "microbatches": 2, "forward_ms": [f, 1.0],
            "backward_input_ms": [b, 1.0], "backward_weight_ms": [w, 1.0], "p2p_ms": 0.0,
            "allreduce_ms": 0.0, "optimizer_ms": 0.0, "activation_mb": [2.0, 1.0],
            "activation_w_mb": [rng.choice([0.0, 0.5, 1.0, 2.0]), 0.0],
            "memory_limit_mb": rng.choice([2.0, 3.0, 4.0, 6.0, 9.0, 20.0])})
        n, trip = rng.randint(1, 30), float(rng.randint(3, 40))
        k = holds(job.costs, 0, n)
        ends = paced_w_ends(job.costs, 0, n, k, trip)
        assert len(ends) == n + 1
        for m in range(n + 1):
            assert ends[m] == paced_stage(job.costs, 0, m, k, trip).last_w_end, (n, m, k)
            compared += 1
    assert compared >= 500
