"""Bound 10, a stage short of memory above starves the fill (planner/bounds_feed.py,
docs/notes/bounds.md section 11): hand-worked values, where it does not apply, and falsification
by random valid plans, the heuristic and CP-SAT (its floor at 0) on jobs where a stage above holds
fewer micro-batches than the stage below needs to cover its fill."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import planner.bounds_feed as bounds_feed
from planner.bounds import Bound, lower_bound, worker_span
from planner.bounds_feed import _covered, fed_fill_bound
from planner.solve import plan
from planner.spec import JobSpec
from tests.planner.test_bound_soundness import random_valid_periods
from tests.planner.test_bound_wave import cp_sat_unfloored

# Made-up job #8 of `benchmarks/gap_unseen.py --seed 58`.
TWO_BY_SEVEN = {"pipelines": 2, "stages": 7, "microbatches": 15,
                "forward_ms": [3.0, 2.9, 8.3, 3.8, 5.5, 7.3, 5.5],
                "backward_input_ms": [3.2, 2.9, 8.5, 4.2, 5.8, 7.9, 6.1],
                "backward_weight_ms": [2.4, 1.2, 3.7, 2.4, 3.6, 3.4, 5.2], "p2p_ms": 0.89,
                "cross_pipeline_p2p_ms": 2.96, "allreduce_ms": 5.4, "optimizer_ms": 3.8,
                "activation_mb": [2.0, 2.4, 2.3, 2.1, 2.2, 1.9, 2.6],
                "activation_w_mb": [1.0, 0.6, 1.15, 1.58, 1.1, 1.42, 1.95], "memory_limit_mb": 28.7}

# Drawn by `drawn_case` below (seed 82): stage 0's survivor holds five micro-batches.
TWO_BY_THREE = {"pipelines": 2, "stages": 3, "microbatches": 4, "forward_ms": [1.0, 1.0, 3.0],
                "backward_input_ms": [1.0, 2.0, 1.0], "backward_weight_ms": [1.0, 5.0, 2.0],
                "p2p_ms": 0.0, "cross_pipeline_p2p_ms": 0.0, "allreduce_ms": 1.0, "optimizer_ms": 0.0,
                "activation_mb": [2.0, 1.0, 1.0], "activation_w_mb": 1.0, "memory_limit_mb": 10.0}


def drawn_case(rng: random.Random) -> tuple[JobSpec, list]:
    """A light stage `up` holding 2 MB per micro-batch lost workers and feeds a stage holding 1 MB
    whose B and W are long against its F, so its workers want many forwards before their first B
    and the stage above runs out of room first: 2-3 pipelines of 2-3 stages, 2-5 micro-batches;
    stage `up` and those above it 1 ms per op, the stage below it F 1-2, B 2-4, W 2-5, any further
    down F and B 1-4, W 1-2; 4-10 MB; one to all but one of stage `up`'s workers dead, sometimes
    one more below (`benchmarks/falsify_fed_fill.py` draws from it too, for longer runs)."""
    D, S, M = rng.randint(2, 3), rng.randint(2, 3), rng.randint(2, 5)
    up = rng.randint(0, S - 2)
    fed = up + 1

    def times(low: int, high: int, low_below: int = 1, high_below: int = 4) -> list[float]:
        return [float(1 if s < fed else rng.randint(low, high) if s == fed
                      else rng.randint(low_below, high_below)) for s in range(S)]
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": times(1, 2),
            "backward_input_ms": times(2, 4), "backward_weight_ms": times(2, 5, 1, 2),
            "p2p_ms": float(rng.randint(0, 1)), "cross_pipeline_p2p_ms": float(rng.randint(0, 2)),
            "allreduce_ms": float(rng.randint(0, 2)), "optimizer_ms": float(rng.randint(0, 1)),
            "activation_mb": [2.0 if s == up else 1.0 for s in range(S)],
            "activation_w_mb": rng.choice([1.0, 0.5]), "memory_limit_mb": float(rng.choice([4, 6, 8, 10]))}
    dead = rng.sample(range(D), rng.randint(1, D - 1))
    failed = [(p, up) for p in sorted(dead)]
    if rng.random() < 0.3:
        failed.append((rng.randrange(D), rng.randint(fed, S - 1)))
    return JobSpec.parse(spec), sorted(set(failed))


def without_it(job: JobSpec, failed, monkeypatch) -> float:
    """`lower_bound` with bound 10 withheld."""
    with monkeypatch.context() as patched:
        patched.setattr(bounds_feed, "fed_fill_bound", lambda *_, **__: Bound(0.0, ""))
        return lower_bound(job, failed).value_ms


def test_the_lone_survivor_above_the_bottleneck():
    """2 x 7 x 15, (0, 1) dead: stage 1's survivor holds 11 (11 x 2.4 <= 28.7) and feeds both
    stage-2 workers, the bottleneck: 15 x (8.3 + 8.5 + 3.7) = 307.5 of work each, all-reduce and
    optimizer 9.2: 316.7, bounds 1-9's value (no forced idle of its own: it holds 12). A stage-2
    worker's first B starts >= F_2 + chain_2 = 8.3 + (3.8 + 4.2 + 5.5 + 5.8 + 7.3 + 7.9 + 5.5 +
    6.1) + 8 x 0.89 = 61.52 after its first F, and until a B is back at stage 1 the two share
    those 11: six and five forwards idle 61.52 - 49.8 = 11.72 and 61.52 - 41.5 = 20.02, so the one
    with five ends 20.02 late: 336.72. Uneven loads do not help: eight and three forwards with 16
    and 14 micro-batches take 16 x 20.5 + 9.2 = 337.2 on the first (the 10 s plan: 344.13)."""
    job, failed = JobSpec.parse(TWO_BY_SEVEN), [(0, 1)]
    assert lower_bound(job, []).value_ms == pytest.approx(316.7)
    fed = fed_fill_bound(job, failed)
    assert fed.value_ms == pytest.approx(336.72, abs=1e-6)
    assert fed.value_ms <= 336.72 + 1e-9
    assert fed.reason.startswith("the fill at stage 2 fed by stage 1: 11 micro-batches")
    assert lower_bound(job, failed).value_ms == pytest.approx(336.72, abs=1e-6)


def test_a_plan_reaches_it_where_the_others_do_not(monkeypatch):
    """2 x 3 x 4, stage 0 of pipeline 1 dead: its survivor holds five (5 x 2 <= 10). Stage 1: F 1,
    B 2, W 5, four micro-batches each: 32 of work, all-reduce 1: 33. Its first B starts >= F_1 +
    F_2 + B_2 = 5 after its first F. Bound 1 lets each worker run its own four forwards first (it
    holds ten): idle 1, 34, the other bounds' value. The two share five: three and two idle 2 and
    3: 36; four and one with loads 4 / 4 take 33 + 4, with 5 / 3 take 40 + 1. The heuristic's plan
    reaches 36."""
    job, failed = JobSpec.parse(TWO_BY_THREE), [(1, 0)]
    assert without_it(job, failed, monkeypatch) == pytest.approx(34.0)
    assert fed_fill_bound(job, failed).value_ms == 36.0
    assert lower_bound(job, failed).value_ms == 36.0
    result = plan(job, failed, use_cp=False)
    assert result.iteration_ms == pytest.approx(36.0)
    assert result.stats.status == "optimal"


def test_a_worker_span_adds_the_drain_only_after_a_forward_outside_the_pool():
    """TWO_BY_THREE's stage 1 (F 1, B 2, W 5, all-reduce 1, chain 4 below it, so a first B 5 after
    its F). One micro-batch, its forward from the pool: F, wait 4, B, W: 8 + 1 + 4 = 13; the fill
    and the drain are the same 4 ms, not 8. Two micro-batches, one forward from the pool: the
    first waits 5 - 1 = 4 before its B; the second's F comes after that window, and its own B is
    again 4 away less the B and W of the first still held (7): 16 + 1 + 4 + 0 = 21. None from the
    pool: 8 + 1 + 5 (fill) + 4 (drain) = 18."""
    costs = JobSpec.parse(TWO_BY_THREE).costs
    assert worker_span(costs, 1, 1, 1, 4.0, after_last_f=4.0) == 13.0
    assert worker_span(costs, 1, 2, 1, 4.0, after_last_f=0.0) == 21.0
    assert worker_span(costs, 1, 1, 0, 4.0, after_last_f=4.0) == 18.0


def test_the_split_of_the_forwards_is_a_knapsack():
    """Levels: no forward 3, two forwards 4, three forwards 5 micro-batches per worker. Two workers
    and a pool of 4 serve 8 (two and two, or three and one); a pool of 5 serves 9 (three and two), 6
    serves 10, none serves 6; three workers with 5 serve 3 + 4 + 5 = 12 (an even split, one and
    two and two, serves only 3 + 4 + 4 = 11, so the knapsack decides)."""
    served = [3, 3, 4, 5]
    assert _covered(served, 2, 4, 8) and not _covered(served, 2, 4, 9)
    assert _covered(served, 2, 5, 9) and not _covered(served, 2, 5, 10)
    assert _covered(served, 2, 6, 10)
    assert _covered(served, 2, 0, 6) and not _covered(served, 2, 0, 7)
    assert _covered(served, 3, 5, 12) and not _covered(served, 3, 5, 13)


@pytest.mark.parametrize("failed", [
    [],          # stage 1 holds 22 for two workers: its own memory, not stage 1's, limits stage 2
    [(0, 2)],    # stage 2 narrower than stage 1: its one worker needs fewer forwards than 11
])
def test_it_claims_nothing_where_the_stage_above_holds_enough(failed, monkeypatch):
    job = JobSpec.parse(TWO_BY_SEVEN)
    others = without_it(job, failed, monkeypatch)
    assert fed_fill_bound(job, failed, floor_ms=others).value_ms == 0.0
    assert lower_bound(job, failed).value_ms == others


def test_a_stage_without_survivors_claims_nothing():
    job = JobSpec.parse(TWO_BY_SEVEN)
    assert fed_fill_bound(job, [(0, 3), (1, 3)]).value_ms == 0.0


def fed_cases():
    return st.integers(0, 2**31).map(lambda seed: (*drawn_case(random.Random(seed)), seed))


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(fed_cases())
def test_no_random_valid_plan_nor_the_heuristic_beats_it(case):
    job, failed, seed = case
    periods = random_valid_periods(job, failed, seed, 20)
    periods.append(plan(job, failed, use_cp=False).iteration_ms)
    assert min(periods) >= fed_fill_bound(job, failed).value_ms


@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(fed_cases())
def test_cp_sat_without_the_bound_never_beats_it(case):
    """CP-SAT's full model with its floor at 0 (not at the analytic bound), from the heuristic plan."""
    job, failed, _ = case
    best, _ = cp_sat_unfloored(job, failed, deterministic_time=1.0)
    bound = fed_fill_bound(job, failed).value_ms
    assert best >= bound - 1e-9, (best, bound)


def test_the_draw_exercises_it(monkeypatch):
    """Guards the draw: in 100 fixed draws the bound applies often and raises the others in some."""
    applies = raises = 0
    for seed in range(100):
        job, failed = drawn_case(random.Random(seed))
        fed = fed_fill_bound(job, failed).value_ms
        applies += fed > 0
        raises += fed > without_it(job, failed, monkeypatch) + 1e-9
    assert applies >= 20 and raises >= 5, (applies, raises)
