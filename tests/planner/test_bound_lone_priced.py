"""Bound 12 (`planner.bounds_priced`, docs/notes/bounds.md section 13): a lone worker's round trips
priced by how many its own pipeline below can serve.

A hand-worked case first, then a second method (the recurrence with each micro-batch's own release,
minimised over every choice of the fast ones, by brute force), then falsification on drawn jobs
built for the case: random valid plans (tests/planner/random_plans.py, nothing of the planner's) and
a CP-SAT search must never beat the bound.
"""

from __future__ import annotations

import itertools
import random

import pytest

import planner.bounds_priced as priced
from planner.bounds import Bound, chain_below, holds, lower_bound, paced_stage, pending_w_cap, stage_hops
from planner.bounds_sharing import crossing_cost
from planner.spec import JobSpec
from tests.planner.bound_falsification import (
    cp_sat_not_below,
    no_random_plan_below,
    raised_cases,
    withholding,
)

PRICED_HERE = "round trips priced at stage"

HAND = {"pipelines": 2, "stages": 2, "microbatches": 3, "forward_ms": [2.0, 2.0],
        "backward_input_ms": [1.0, 2.0], "backward_weight_ms": [1.0, 10.0], "p2p_ms": 0.5,
        "cross_pipeline_p2p_ms": 1.5, "allreduce_ms": 3.0, "optimizer_ms": 1.0, "activation_mb": 1.0,
        "activation_w_mb": 1.0, "memory_limit_mb": 1.0}


def test_hand_worked_one_slot():
    """2 x 2 x 3 with (1, 0) dead: (0, 0) runs all 6 micro-batches and holds one at a time (1 MB of
    1, freed only at W end), so it runs them one after another: F0 2, hop 0.5, F1 2, B1 2, hop 0.5,
    B0 1, W0 1 = 9 ms each through (0, 1), 2 x (1.5 - 0.5) = 2 more through (1, 1). With c through
    (0, 1) its last W ends >= 9 x 6 + 2 (6 - c) = 66 - 2c, and the period adds AR + OPT = 4:
    70 - 2c. (0, 1) spends F + B + W = 14 ms on each: P >= 14c + 4. c = 4: max(62, 60) = 62;
    c = 5: 74; c = 3: 64. The bound is 62 (the unpriced recurrence, every trip at 9 ms: 58)."""
    job = JobSpec.parse(HAND)
    costs = job.costs
    for fast in range(7):
        value = priced.priced_last_w_end(costs, 0, 6, 1, 8.0, 2.0, fast, shadowed=True)
        assert value + 4.0 == pytest.approx(70.0 - 2 * fast, abs=1e-6)
        assert priced.own_chain_period(costs, 0, 2, fast) == pytest.approx(14.0 * fast + 4.0)
    assert crossing_cost(costs, stage_hops(costs, 2), 0, 1) == pytest.approx(2.0)
    bound = priced.priced_round_trip_bound(job, [(1, 0)])
    assert bound.value_ms == pytest.approx(62.0, abs=1e-6)
    assert bound.reason.startswith(PRICED_HERE)


def test_made_up_5x4x19_with_stage_0_left_to_one_worker():
    """Fresh seed 72's fifth job (`benchmarks/gap_unseen.py --seed 72`), stage 0 left to (1, 0): 95
    micro-batches, 6 held at once, each round trip 53.8 ms at the least hop and 2.9 ms more when it
    crosses pipelines. Bound 6 said 917.2 (every trip at 53.8); with every trip crossing it would
    say 960.8 (the LP's two ends, checked against the recurrence itself). Pipeline 1 below serves at
    most 37 of them (24.6 ms each at stage 1, and 14.7 of all-reduce and step: 37 x 24.6 + 14.7 =
    924.9), so at least 58 cross: 937.63. The 10 s plan is 957.9 (1.022 of it; 1.044 of 917.2)."""
    job = JobSpec.parse({
        "pipelines": 5, "stages": 4, "microbatches": 19, "forward_ms": [3.1, 9.5, 6.3, 6.1],
        "backward_input_ms": [3.0, 9.0, 6.5, 6.1], "backward_weight_ms": [2.9, 6.1, 6.0, 5.2],
        "p2p_ms": 0.7, "cross_pipeline_p2p_ms": 2.15, "allreduce_ms": 10.3, "optimizer_ms": 4.4,
        "activation_mb": [3.1, 1.8, 1.3, 2.9], "activation_w_mb": [1.55, 0.45, 0.33, 2.17],
        "memory_limit_mb": 20.8})
    failed = [(0, 0), (2, 0), (3, 0), (4, 0)]
    costs = job.costs
    round_trip = costs.forward[0] + chain_below(costs, stage_hops(costs, 4), 0) + costs.backward_input[0]
    assert round_trip == pytest.approx(53.8)
    tail = costs.allreduce[0] + costs.optimizer[0]
    for fast, trip in ((0, round_trip + 2.9), (95, round_trip)):
        lp = priced.priced_last_w_end(costs, 0, 95, 6, round_trip, 2.9, fast, shadowed=True)
        assert lp == pytest.approx(paced_stage(costs, 0, 95, 6, trip).last_w_end, abs=1e-4)
    assert paced_stage(costs, 0, 95, 6, round_trip).last_w_end + tail == pytest.approx(917.2)
    bound = lower_bound(job, failed)
    assert bound.reason.startswith(PRICED_HERE)
    assert bound.value_ms == pytest.approx(937.63, abs=0.01)


def direct_priced(costs, s, n, k, round_trip, fast_set, extra) -> float:
    """Bound 6's recurrence written out directly (every i, every count), each micro-batch of F index
    i released `off_i` late: off_i = min over l >= i of (l - i) F + extra (l slow) or 0 (l fast),
    the least any B of index >= i can be released after t_i + round trip - B. The last W end."""
    f, b, w = costs.forward[s], costs.backward_input[s], costs.backward_weight[s]
    held = min(k, n)
    off = [min((ell - i) * f + (0.0 if ell in fast_set else extra) for ell in range(i, n)) for i in range(n)]
    release = round_trip - b

    def after(starts, backs, weights, forwards):
        return max(starts[i] + off[i] + release + (backs - i) * b + max(0, weights - i) * w
                   + max(0, forwards - i) * f for i in range(backs))

    starts = [0.0]
    for j in range(1, n):
        least = float("inf")
        for x in range(min(held, j + 1)):
            y = pending_w_cap(costs, s, x + 1, n)
            if y < 0:
                break
            least = min(least, 0.0 if j - x <= 0 else max(0.0, after(starts, j - x, j - x - y, j - held)))
        starts.append(max(starts[-1] + f, least))
    return after(starts, n, n, n - held)


def test_the_lp_relaxes_every_choice_of_the_fast_ones():
    """Second method: for every number c of fast micro-batches, the LP is at most the recurrence
    minimised by brute force over every set of at most c fast ones (it is a relaxation of that
    minimum). The LP commits to its chains before the schedule says how many it holds at each F, so
    it can be lower than the recurrence, which picks the chain after (c = 0 uses the recurrence
    itself, `_stage_bound`); it is equal to the minimum in most cases."""
    rng = random.Random(5)
    checked = tight = 0
    for _ in range(40):
        job, n, round_trip, extra = _draw_small(rng)
        costs = job.costs
        k = holds(costs, 0, n)
        for fast in range(n + 1):
            lp = max(priced.priced_last_w_end(costs, 0, n, k, round_trip, extra, fast, shadowed)
                     for shadowed in (True, False))
            least = min(direct_priced(costs, 0, n, k, round_trip, set(chosen), extra)
                        for size in range(fast + 1) for chosen in itertools.combinations(range(n), size))
            assert lp <= least + 1e-6, (n, k, round_trip, extra, fast, lp, least)
            checked += 1
            tight += lp >= least - 1e-6
    assert checked >= 150
    assert tight >= checked // 2, (tight, checked)


def _draw_small(rng: random.Random):
    """(stage costs with whole milliseconds, 2 MB a micro-batch; n; round trip; the crossing extra,
    from below to well above F). Only stage 0's costs and the memory matter here."""
    f, b, w = (float(rng.randint(1, 3)) for _ in range(3))
    spec = {"pipelines": 2, "stages": 2, "microbatches": 3, "forward_ms": [f, 1.0],
            "backward_input_ms": [b, 1.0], "backward_weight_ms": [w, 1.0], "p2p_ms": 0.0,
            "allreduce_ms": 0.0, "optimizer_ms": 0.0, "activation_mb": [2.0, 1.0],
            "activation_w_mb": [rng.choice([0.0, 1.0, 2.0]), 0.0],
            "memory_limit_mb": rng.choice([2.0, 3.0, 4.0, 5.0, 6.0])}
    return (JobSpec.parse(spec), rng.randint(2, 7), float(rng.randint(4, 20)),
            rng.choice([0.5, 1.0, 2.5, 4.0]))


def drawn_lone_case(rng: random.Random):
    """A small job with stage s left to one or two workers, cheap and holding two
    micro-batches, heavier stages below (their W's heaviest) and a dearer cross-pipeline hop, so that
    a survivor's own pipeline below cannot take every round trip. Whole milliseconds."""
    D, S, M = rng.randint(2, 4), rng.randint(2, 3), rng.randint(2, 4)
    s = rng.randrange(S - 1)

    def times(low, high):
        return [float(rng.randint(1, 2) if t == s else rng.randint(low, high)) for t in range(S)]
    p2p = float(rng.randint(0, 1))
    job = JobSpec.parse({
        "pipelines": D, "stages": S, "microbatches": M, "forward_ms": times(1, 4),
        "backward_input_ms": times(1, 4), "backward_weight_ms": times(3, 8), "p2p_ms": p2p,
        "cross_pipeline_p2p_ms": p2p + rng.randint(1, 3), "allreduce_ms": float(rng.randint(0, 3)),
        "optimizer_ms": float(rng.randint(0, 1)), "activation_mb": 2.0,
        "activation_w_mb": rng.choice([0.0, 1.0, 2.0]),
        "memory_limit_mb": rng.choice([4.0, 5.0])})
    keep = rng.sample(range(D), 1 if D == 2 else rng.randint(1, 2))
    return job, sorted((p, s) for p in range(D) if p not in keep), rng.randrange(2**31)


def without_bound_12(job, failed, floor_ms=0.0) -> Bound:
    return Bound(0.0, "")


def raised(monkeypatch):
    """Whether the full bound is above the bound with bound 12 withheld."""
    return withholding(priced, "priced_round_trip_bound", without_bound_12, monkeypatch)


def test_the_drawn_cases_exercise_bound_12(monkeypatch):
    """The falsification below means something only if bound 12 raises many of its cases, some of
    them with two survivors (the busiest of them priced)."""
    is_raised = raised(monkeypatch)
    cases = [drawn_lone_case(random.Random(seed))[:2] for seed in range(120)]
    raised_cases_ = [(job, failed) for job, failed in cases if is_raised(job, failed)]
    two = sum(job.pipelines - len(failed) == 2 for job, failed in raised_cases_)
    assert len(raised_cases_) >= 14 and two >= 3, (len(raised_cases_), two)


def test_no_random_valid_plan_beats_a_bound_12_raised(monkeypatch):
    """The first 12 drawn cases whose bound bound 12 raises, 40 random valid plans each (staying on
    the home pipeline with several chances, so that some plans send many trips the cheap way)."""
    no_random_plan_below(raised_cases(drawn_lone_case, raised(monkeypatch), 12, 300))


def test_cp_sat_never_beats_a_bound_12_raised(monkeypatch):
    """The first 6 drawn cases whose bound bound 12 raises: CP-SAT's full model (free routing) given
    3 s from the heuristic plan, with its floor at 0 rather than at the bound."""
    cp_sat_not_below(raised_cases(drawn_lone_case, raised(monkeypatch), 6, 300))


def test_a_floor_only_skips_what_it_already_proves():
    """`lower_bound` passes the other bounds' best as `floor_ms`: whatever the floor, max(floor,
    bound with it) must equal max(floor, bound without it)."""
    checked = 0
    for seed in range(30):
        job, failed, _ = drawn_lone_case(random.Random(seed))
        exact = priced.priced_round_trip_bound(job, failed).value_ms
        for floor in (exact - 1.0, exact - 1e-6, exact, exact + 3.0):
            got = priced.priced_round_trip_bound(job, failed, floor_ms=floor).value_ms
            assert max(floor, got) == pytest.approx(max(floor, exact), abs=1e-6)  # LP round-off
        checked += exact > 0
    assert checked >= 10
