"""Bound 11, the first gradients queue at a narrower stage below (planner/bounds_queue.py,
docs/notes/bounds.md section 12): hand-worked values, where it claims nothing, and falsification
by random valid plans, the heuristic and CP-SAT (its floor at 0) on jobs with a failure at the
stage below a full one."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import planner.bounds_queue as bounds_queue
from planner.bounds import Bound, lower_bound
from planner.bounds_queue import queued_fill_bound
from planner.solve import plan
from planner.spec import JobSpec
from tests.planner.test_bound_soundness import random_valid_periods
from tests.planner.test_bound_wave import cp_sat_unfloored

# Made-up job #8 of `benchmarks/gap_unseen.py --seed 55`.
SIX_BY_THREE = {"pipelines": 6, "stages": 3, "microbatches": 10, "forward_ms": [4.7, 6.5, 4.5],
                "backward_input_ms": [4.4, 7.4, 4.5], "backward_weight_ms": [1.5, 5.6, 2.4],
                "p2p_ms": 0.84, "cross_pipeline_p2p_ms": 2.28, "allreduce_ms": 19.4, "optimizer_ms": 2.2,
                "activation_mb": [1.7, 3.3, 2.0], "activation_w_mb": [0.42, 2.47, 1.5],
                "memory_limit_mb": 10.8}

# Made-up job #7 of `benchmarks/gap_unseen.py --seed 39`.
FIVE_BY_TWO = {"pipelines": 5, "stages": 2, "microbatches": 5, "forward_ms": [5.4, 2.4],
               "backward_input_ms": [4.9, 2.3], "backward_weight_ms": [3.7, 2.3], "p2p_ms": 0.53,
               "cross_pipeline_p2p_ms": 1.08, "allreduce_ms": 31.6, "optimizer_ms": 4.6,
               "activation_mb": [3.0, 3.9], "activation_w_mb": [3.0, 3.9], "memory_limit_mb": 7.8}


def without_it(job: JobSpec, failed, monkeypatch) -> float:
    """`lower_bound` with bound 11 withheld."""
    with monkeypatch.context() as patched:
        patched.setattr(bounds_queue, "queued_fill_bound", lambda *_: Bound(0.0, ""))
        return lower_bound(job, failed).value_ms


def assert_hand_worked(job: JobSpec, failed, monkeypatch, others: float, value: float, reason: str) -> None:
    """Bound 11 gives `value` for `reason` where the other bounds give `others`; it is the failure
    set's bound, and the heuristic plan is not below it."""
    assert without_it(job, failed, monkeypatch) == pytest.approx(others)
    queued = queued_fill_bound(job, failed)
    assert queued.value_ms == pytest.approx(value, abs=1e-9)
    assert queued.reason == reason
    assert lower_bound(job, failed).value_ms == pytest.approx(value, abs=1e-9)
    assert plan(job, failed, use_cp=False).iteration_ms >= value - 1e-9


def test_six_first_gradients_on_five_workers(monkeypatch):
    """6 x 3 x 10, (5, 2) dead. Stage 1 is the bottleneck: 10 x (6.5 + 7.4 + 5.6) = 195 of work
    each, all-reduce and optimizer 21.6: 216.6 (bound 4 prices the cut worker's crossings: 217.16).
    A stage-1 worker holds three (3 x 3.3 <= 10.8), so its three forwards cover 19.5 - 6.5 = 13 ms
    of its first round trip, which takes 0.84 + 4.5 + 4.5 + 0.84 = 10.68 alone. Six first
    gradients need five stage-2 workers: one serves two, F and B each, 18 ms, all after the
    earliest could arrive: the later one is back 18 + 1.68 - 13 = 6.68 ms after its worker ran out
    of forwards, and a later start only moves that idle to the others (one all-reduce): 223.28.
    CP-SAT's routing-fixed model from the 10 s plan (224.72) reaches 223.28 in 90 s."""
    assert_hand_worked(JobSpec.parse(SIX_BY_THREE), [(5, 2)], monkeypatch, 217.16, 223.28,
                       "first gradients queued below stage 1: 6 workers there share 5 at stage 2")


def test_five_first_gradients_on_four_workers(monkeypatch):
    """5 x 2 x 5, (3, 1) dead: stage 0 carries 5 x (5.4 + 4.9 + 3.7) = 70 each, all-reduce and
    optimizer 36.2; it holds two (2 x 3.0 <= 7.8), one forward to cover a round trip of 0.53 + 2.4
    + 2.3 + 0.53. One stage-1 worker serves two first micro-batches: 2 x 4.7 = 9.4, back 9.4 +
    1.06 - 5.4 = 5.06 ms late: 111.26 (the others: 107.66). The 10 s plan reaches 111.26."""
    assert_hand_worked(JobSpec.parse(FIVE_BY_TWO), [(3, 1)], monkeypatch, 107.66, 111.26,
                       "first gradients queued below stage 0: 5 workers there share 4 at stage 1")


# Made-up job #9 of `benchmarks/gap_unseen.py --seed 5`.
SIX_BY_THREE_DEEP = {"pipelines": 6, "stages": 3, "microbatches": 10, "forward_ms": [8.9, 5.6, 5.1],
                     "backward_input_ms": [9.3, 5.1, 5.7], "backward_weight_ms": [5.8, 3.5, 2.9],
                     "p2p_ms": 0.52, "cross_pipeline_p2p_ms": 2.93, "allreduce_ms": 8.8,
                     "optimizer_ms": 2.9, "activation_mb": [1.4, 1.1, 2.0],
                     "activation_w_mb": [1.4, 1.1, 2.0], "memory_limit_mb": 6.0}


def test_the_queue_two_stages_down(monkeypatch):
    """6 x 3 x 10, (5, 2) dead: stage 0 is the bottleneck, 10 x (8.9 + 9.3 + 5.8) = 240 of work
    each, all-reduce and optimizer 11.7: 251.7. It holds four (4 x 1.4 <= 6), three forwards
    (26.7 ms) to cover its first round trip. Six first micro-batches meet five stage-2 workers: the
    one served second reaches stage 2 after stage 1's F and hops, and its gradient comes back
    through stage 1's B: (5.6 + 5.1) + 4 x 0.52 + 2 x (5.1 + 5.7) = 34.38, 7.68 ms more than the
    forwards cover: 259.38 (bounds 1-10: 253.40; the 10 s plan 261.8). Stage 1, with six
    survivors, queues nothing."""
    assert_hand_worked(JobSpec.parse(SIX_BY_THREE_DEEP), [(5, 2)], monkeypatch, 253.40, 259.38,
                       "first gradients queued below stage 0: 6 workers there share 5 at stage 2")


# Made-up job #8 of `benchmarks/gap_unseen.py --seed 67`.
FIVE_BY_FIVE = {"pipelines": 5, "stages": 5, "microbatches": 11, "forward_ms": [8.2, 3.7, 9.6, 2.4, 6.8],
                "backward_input_ms": [8.5, 4.0, 8.7, 2.4, 6.3],
                "backward_weight_ms": [6.7, 2.1, 2.9, 1.4, 2.7], "p2p_ms": 0.44,
                "cross_pipeline_p2p_ms": 2.91, "allreduce_ms": 39.6, "optimizer_ms": 4.5,
                "activation_mb": [4.0, 1.6, 1.6, 1.9, 1.0],
                "activation_w_mb": [3.0, 1.2, 1.2, 0.47, 0.25], "memory_limit_mb": 20.7}


def test_three_first_round_trips_through_one_worker(monkeypatch):
    """5 x 5 x 11 with three of stage 1's five workers dead. Stage 0 carries 11 x (8.2 + 8.5 + 6.7)
    = 257.4 each, all-reduce and optimizer 44.1: 301.5. It holds five (5 x 4.0 <= 20.7), so four
    more forwards (32.8 ms) follow the first before its gradient must be back. Five first
    micro-batches meet two stage-1 workers: one serves three. Below stage 1 a round trip takes
    9.6 + 2.4 + 6.8 + 6.3 + 2.4 + 8.7 + 6 x 0.44 = 38.84 ms. On that worker the three F's (3.7)
    run one after another, so the last of them ends >= 11.1 ms into the window and its B (4.0)
    ends >= 11.1 + 38.84 + 4.0 in; the three B's run one after another from >= 3.7 + 38.84 in and
    end >= 3.7 + 38.84 + 12.0 = 54.54 in, the larger. With the hops to stage 1 and back (0.88):
    54.54 + 0.88 - 32.8 = 22.62 ms the forwards do not cover: 324.12. Counting the queue alone
    (3 x 7.7) or the round trip alone (46.54) gives 316.12; bound 4 prices the cut workers'
    crossings at 321.06. The 10 s plan: 331.23."""
    assert_hand_worked(JobSpec.parse(FIVE_BY_FIVE), [(3, 1), (1, 1), (0, 1)], monkeypatch, 321.06,
                       324.12, "first gradients queued below stage 0: 5 workers there share 2 at stage 1")


def test_uneven_loads_cap_it():
    """2 x 2 x 1, (0, 1) dead, stage 0 light (F = B = W = 1) and stage 1 heavy (F = B = 5): the
    two first micro-batches queue 20 ms at stage 1, but one stage-0 worker may serve both and the
    other none: 2 x 3 + 1 = 7 is all this bound may claim."""
    job = JobSpec.parse({"pipelines": 2, "stages": 2, "microbatches": 1, "forward_ms": [1.0, 5.0],
                         "backward_input_ms": [1.0, 5.0], "backward_weight_ms": [1.0, 1.0],
                         "p2p_ms": 0.0, "cross_pipeline_p2p_ms": 0.0, "allreduce_ms": 1.0,
                         "optimizer_ms": 0.0, "activation_mb": 1.0, "activation_w_mb": 1.0,
                         "memory_limit_mb": 4.0})
    assert queued_fill_bound(job, [(0, 1)]).value_ms == 7.0


@pytest.mark.parametrize("failed", [
    [],                  # no stage narrower than the one above it
    [(5, 1)],            # stage 1 narrower than stage 0, whose survivors hold enough
    [(5, 1), (4, 2)],    # 5 stage-1 workers do not split 60 evenly
])
def test_it_claims_nothing_where_it_does_not_apply(failed, monkeypatch):
    job = JobSpec.parse(SIX_BY_THREE)
    assert queued_fill_bound(job, failed).value_ms <= without_it(job, failed, monkeypatch)


def test_a_stage_without_survivors_claims_nothing():
    job = JobSpec.parse(FIVE_BY_TWO)
    assert queued_fill_bound(job, [(p, 1) for p in range(5)]).value_ms == 0.0


def drawn_case(rng: random.Random) -> tuple[JobSpec, list]:
    """A full stage t, the heaviest, over a stage t + 1 that lost one or two workers: stage t holds
    one to three micro-batches and its F is short against F + B below, so the first gradients
    queue; the other stages are light (`benchmarks/falsify_queued_fill.py` draws from it too, for
    longer runs)."""
    D, S = rng.randint(2, 4), rng.randint(2, 3)
    t = rng.randrange(S - 1)

    def ms(s: int, heavy: tuple[int, int], below: tuple[int, int]) -> float:
        return float(rng.randint(*heavy) if s == t else rng.randint(*below) if s == t + 1
                     else rng.randint(1, 2))

    spec = {"pipelines": D, "stages": S, "microbatches": rng.randint(1, 4),
            "forward_ms": [ms(s, (1, 2), (1, 4)) for s in range(S)],
            "backward_input_ms": [ms(s, (3, 7), (1, 4)) for s in range(S)],
            "backward_weight_ms": [ms(s, (2, 5), (1, 2)) for s in range(S)],
            "p2p_ms": float(rng.randint(0, 1)), "cross_pipeline_p2p_ms": float(rng.randint(1, 2)),
            "allreduce_ms": float(rng.randint(0, 3)), "optimizer_ms": float(rng.randint(0, 2)),
            "activation_mb": [2.0 if s == t else 1.0 for s in range(S)],
            "activation_w_mb": [float(rng.choice([1, 2])) if s == t else 1.0 for s in range(S)],
            "memory_limit_mb": 2.0 * rng.randint(1, 3) + 1.0}
    dead = rng.sample(range(D), 1 if D < 3 or rng.random() < 0.6 else 2)
    below = t + 1 if t + 2 >= S or rng.random() < 0.6 else t + 2  # the narrower stage, at times deeper
    return JobSpec.parse(spec), sorted((p, below) for p in dead)


def chain_case(rng: random.Random) -> tuple[JobSpec, list]:
    """Like `drawn_case` at t = 0 over a stage 1 that lost workers, but with a stage 2 below it, so
    the round trip below the queue (not the queue alone) sets how late the first gradients come
    back, and a stage 0 heavy enough that one more micro-batch there (the uneven cap) does not
    hide it: the term that counts the other F's before that round trip or the other B's after it
    (`_queued_chain`) decides there."""
    D = rng.randint(2, 4)
    spec = {"pipelines": D, "stages": 3, "microbatches": rng.randint(1, 3),
            "forward_ms": [1.0, float(rng.randint(1, 3)), float(rng.randint(2, 4))],
            "backward_input_ms": [float(rng.randint(6, 10)), float(rng.randint(1, 3)),
                                  float(rng.randint(2, 4))],
            "backward_weight_ms": [float(rng.randint(4, 8)), 1.0, 1.0],
            "p2p_ms": float(rng.randint(0, 1)), "cross_pipeline_p2p_ms": float(rng.randint(1, 2)),
            "allreduce_ms": float(rng.randint(0, 3)), "optimizer_ms": float(rng.randint(0, 2)),
            "activation_mb": [2.0, 1.0, 1.0], "activation_w_mb": [float(rng.choice([1, 2])), 1.0, 1.0],
            "memory_limit_mb": 2.0 * rng.randint(1, 3) + 1.0}
    dead = rng.sample(range(D), 1 if D < 3 or rng.random() < 0.5 else 2)
    return JobSpec.parse(spec), sorted((p, 1) for p in dead)


def cases_of(draw):
    """Hypothesis draws of `draw(rng)` with the seed that made each (for the random plans)."""
    return st.integers(0, 2**31).map(lambda seed: (*draw(random.Random(seed)), seed))


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases_of(chain_case))
def test_round_trip_below_the_queue_holds(case):
    """Random valid plans, the heuristic and CP-SAT's full model (floor 0) never beat bound 11
    where the round trip below the narrower stage is long."""
    job, failed, seed = case
    periods = random_valid_periods(job, failed, seed, 20)
    best, _ = cp_sat_unfloored(job, failed, deterministic_time=0.5)
    periods.append(best)
    assert min(periods) >= queued_fill_bound(job, failed).value_ms - 1e-9


def test_the_chain_draw_exercises_the_round_trip_term(monkeypatch):
    """Guards `chain_case`: in 100 fixed draws, counting the others' F's before the round trip below
    the queue or their B's after it raises bound 11 above what the queue alone or the round trip
    alone gives in many of them."""

    def either_alone(costs, hop, t, u, queued):
        between = 2 * sum(hop[t:u])
        f, b = costs.forward[u], costs.backward_input[u]
        return max(between + queued * (f + b), between + f + bounds_queue.chain_below(costs, hop, u) + b)

    raised = 0
    for seed in range(100):
        job, failed = chain_case(random.Random(seed))
        with_it = queued_fill_bound(job, failed).value_ms
        with monkeypatch.context() as patched:
            patched.setattr(bounds_queue, "_queued_chain", either_alone)
            raised += with_it > queued_fill_bound(job, failed).value_ms + 1e-9
    assert raised >= 40, raised


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases_of(drawn_case))
def test_no_random_valid_plan_nor_the_heuristic_beats_it(case):
    job, failed, seed = case
    periods = random_valid_periods(job, failed, seed, 20)
    periods.append(plan(job, failed, use_cp=False).iteration_ms)
    assert min(periods) >= queued_fill_bound(job, failed).value_ms - 1e-9


@settings(max_examples=10, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases_of(drawn_case))
def test_cp_sat_without_the_bound_never_beats_it(case):
    """CP-SAT's full model with its floor at 0 (not at the analytic bound), from the heuristic plan."""
    job, failed, _ = case
    best, _ = cp_sat_unfloored(job, failed, deterministic_time=1.0)
    bound = queued_fill_bound(job, failed).value_ms
    assert best >= bound - 1e-9, (best, bound)


def test_the_draw_exercises_it(monkeypatch):
    """Guards the draw: in 100 fixed draws the bound applies often and raises the others in some."""
    applies = raises = 0
    for seed in range(100):
        job, failed = drawn_case(random.Random(seed))
        queued = queued_fill_bound(job, failed).value_ms
        applies += queued > 0
        raises += queued > without_it(job, failed, monkeypatch) + 1e-9
    assert applies >= 90 and raises >= 5, (applies, raises)
