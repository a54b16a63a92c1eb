"""Bound 5 (`planner.bounds_pairs`, docs/notes/bounds.md section 6): round trips sharing the next
stage's workers when two adjacent stages hold one micro-batch at a time.

A hand-worked value first, then falsification on jobs built for the bound to bind (one micro-batch
at a time at both stages, stage-1 failures that cut stage-0 workers, or stage-0 failures that leave
stage-1 workers without their own feeder): random valid plans (tests/planner/random_plans.py), the
planner's own plans and a CP-SAT search must never beat it.
"""

from __future__ import annotations

import random

import pytest

import planner.bounds_pairs as bounds_pairs
from planner.bounds import Bound, lower_bound
from planner.bounds_pairs import pair_bound
from planner.candidates import best_heuristic
from planner.spec import JobSpec
from tests.planner.test_bound_soundness import random_valid_periods

HAND = {"pipelines": 2, "stages": 2, "microbatches": 3, "forward_ms": [2, 2], "backward_input_ms": [2, 2],
        "backward_weight_ms": [1, 1], "p2p_ms": 0, "cross_pipeline_p2p_ms": 2, "allreduce_ms": 0,
        "optimizer_ms": 0, "activation_mb": 2, "activation_w_mb": 1, "memory_limit_mb": 3}


def _without_pairs(job, failed, monkeypatch):
    monkeypatch.setattr(bounds_pairs, "pair_bound", lambda *a, **k: Bound(0.0, ""))
    value = lower_bound(job, failed).value_ms
    monkeypatch.undo()
    return value


def test_hand_worked_pair_bound(monkeypatch):
    """2 x 2 x 3, worker [1, 1] dead. Memory 3 MB, activation 2, activation_w 1: one micro-batch
    between F start and B end per worker, and q = 1 W pending beside it. Stage-1 window T = F + B =
    4 ms; own round trip J = F + T + B = 8 ms (same-pipeline hop 0), cut one 12 (cross hop 2 each
    way); two stage-1 windows in a row from [0, 0] are G = F + B = 4 apart; a window of [1, 0]'s
    between two of [0, 0]'s costs [0, 0] max(T, F + B + (2 - q) W) - G = 5 - 4 = 1 ms. W = 1 after
    the last window on each stage, no all-reduce or optimizer.
    [0, 1] serves all 6 micro-batches: 6 T + (a - rho) G + W <= P, with a on [0, 0] in rho runs.
    At P = 33: the cut [1, 0] serves at most 2 (2 x 12 + 1 = 25; 3 -> 37), so [0, 0] needs a >= 4;
    a = 4 needs rho >= 2 at stage 1 (25 + 4 (4 - rho) <= 33) and then costs [0, 0] 4 x 8 + 1 + 1 =
    34 > 33; a = 5 or 6 is over at stage 0 (41). At P = 34, a = 4, rho = 2, two on [1, 0] fit:
    the bound is 34 (bounds 1-4 say 33). CP-SAT proves the optimum 35 (full model, 30 s of
    deterministic time, 2026-11-23), so 34 is sound and 1 ms short."""
    job = JobSpec.parse(HAND)
    failed = [(1, 1)]
    bound = pair_bound(job, failed).value_ms
    assert 34.0 - 1e-6 < bound <= 34.0
    assert lower_bound(job, failed).value_ms == bound
    assert lower_bound(job, failed).reason.startswith("round trips sharing stage 1")
    assert _without_pairs(job, failed, monkeypatch) == 33.0
    _, period, _ = best_heuristic(job, tuple(failed))
    assert period >= 35.0


def test_no_pair_bound_with_room_for_two_micro_batches():
    """With memory for two micro-batches at stage 1 the gaps argument does not hold: no bound."""
    job = JobSpec.parse({**HAND, "memory_limit_mb": 4})
    assert pair_bound(job, [(1, 1)]).value_ms == 0.0


def pair_cases(seed: int):
    """Jobs built for bound 5 to bind (they mirror benchmarks/gap_unseen.py seed 1, job #2)."""
    rng = random.Random(seed)
    D, S, M = rng.randint(2, 4), rng.choice([2, 2, 3]), rng.randint(2, 6)
    per = lambda: [float(rng.randint(1, 4) * (1 + (s >= 1) * rng.randint(0, 2))) for s in range(S)]  # noqa: E731
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": per(), "backward_input_ms": per(),
            "backward_weight_ms": per(), "p2p_ms": rng.randint(0, 1) / 2,
            "cross_pipeline_p2p_ms": float(rng.randint(1, 3)), "allreduce_ms": float(rng.randint(0, 3)),
            "optimizer_ms": float(rng.randint(0, 1)), "activation_mb": 2.0,
            "activation_w_mb": float(rng.choice([0, 1, 2])), "memory_limit_mb": rng.choice([2.0, 3.0, 3.5])}
    job = JobSpec.parse(spec)
    failed = sorted({(rng.randrange(D), rng.choice([1, 1, 0, S - 1])) for _ in range(rng.randint(1, 2))})
    if any(all((p, s) in failed for p in range(D)) for s in range(S)):
        failed = failed[:1]
    return job, failed, rng.randrange(2**31)


RAISED_SEEDS = [8, 71, 74, 135, 150, 154, 169, 194, 217, 250, 273, 312, 342, 396, 416, 452, 495,
                498, 516, 564, 592]
"""The `pair_cases` seeds below 600 where bound 5 was above bounds 1-4 and 7 when it was written (21
of 600): bound 5 is falsified on all of them. Seed 262 left the list when bound 4 learnt that a
worker whose pipeline lost a lower stage crosses pipelines on the way (206.0 -> 222.0 there)."""

BINDING_SEEDS = [71, 74, 169, 194, 273, 416]
"""Those of them where bound 5 is still above every other bound (checked by
test_the_binding_seeds_bind). The other 15 left when bound 4 priced the round trips by where they
are served (docs/notes/bounds.md section 4, "Priced trips"): on seed 8 that gives 109.0 against
bound 5's 109.0 - 1e-9 (the heuristic and CP-SAT 20 s reach 114)."""


def test_the_binding_seeds_bind(monkeypatch):
    for seed in BINDING_SEEDS:
        job, failed, _ = pair_cases(seed)
        assert pair_bound(job, failed).value_ms > _without_pairs(job, failed, monkeypatch), seed


@pytest.mark.parametrize("seed", RAISED_SEEDS + list(range(20)))
def test_no_random_valid_plan_or_heuristic_plan_beats_the_pair_bound(seed):
    job, failed, plan_seed = pair_cases(seed)
    bound = pair_bound(job, failed).value_ms
    periods = random_valid_periods(job, failed, plan_seed, 20,
                                   stay_home=lambda rng: rng.choice([0.5, 0.9, 1.0]))
    periods.append(best_heuristic(job, tuple(failed))[1])
    assert min(periods) >= bound, (min(periods), bound)


@pytest.mark.parametrize("seed", BINDING_SEEDS)
def test_cp_sat_never_beats_the_pair_bound(seed, monkeypatch):
    """CP-SAT from the planner's heuristic plan, with no analytic bound given to it."""
    from planner.cp import cpsat

    job, failed, _ = pair_cases(seed)
    bound = pair_bound(job, failed).value_ms
    assert bound > _without_pairs(job, failed, monkeypatch)  # the cases where bound 5 binds
    ops, period, _ = best_heuristic(job, tuple(failed))
    # Deterministic time 3 or 6 s of wall, whichever comes first (on these models CP-SAT's
    # deterministic clock ran at 0.5 per 30 s of wall on the loaded box).
    found = cpsat.improve(job, tuple(failed), ops, period + 1.0, 0.0, 6.0, seed=3, deterministic_time=3.0)
    best = period if found.ops is None else min(period, found.period_ms)
    assert best >= bound, (best, bound)


def test_pair_bound_is_the_same_whatever_was_asked_before():
    """The thresholds are cached per job and stage (the search asks again with other floors): a
    first question with a floor above the bound (answered: nothing above it) must not hide the
    bound from a later question with a lower floor."""
    bounds_pairs._CACHE.clear()
    job = JobSpec.parse(HAND)
    assert pair_bound(job, [(1, 1)], floor_ms=40.0).value_ms == 0.0
    assert 34.0 - 1e-6 < pair_bound(job, [(1, 1)]).value_ms <= 34.0
    assert pair_bound(job, [(1, 1)], floor_ms=30.0).value_ms == pair_bound(job, [(1, 1)]).value_ms
    bounds_pairs._CACHE.clear()
    low, high = pair_bound(job, [(1, 1)], floor_ms=20.0), pair_bound(job, [(1, 1)], floor_ms=33.5)
    assert low.value_ms == high.value_ms
