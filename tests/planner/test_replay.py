"""The replay's steady-state period on cases small enough to work out by hand, jitter, deadlock."""

from __future__ import annotations

import pytest

from planner import simulator
from planner.simulator import ReplayError, replay
from planner.solve import plan
from planner.timeline import Op
from planner.validate import validate

# F 1, B 2, W 3, all-reduce 4, optimizer 5, hop 0.5 ms on every stage.
UNIT = {"forward_ms": 1.0, "backward_input_ms": 2.0, "backward_weight_ms": 3.0, "p2p_ms": 0.5,
        "cross_pipeline_p2p_ms": 0.5, "allreduce_ms": 4.0, "optimizer_ms": 5.0}


@pytest.fixture
def one_worker_job(make_job):
    return make_job(pipelines=1, stages=1, microbatches=3, **UNIT)


@pytest.fixture
def two_stage_job(make_job):
    return make_job(pipelines=1, stages=2, microbatches=1, **UNIT)


def one_worker_ops() -> list[Op]:
    """F B W per micro-batch back to back, then the all-reduce and the optimizer step."""
    ops, t = [], 0.0
    for m in range(3):
        for kind, d in (("F", 1.0), ("B", 2.0), ("W", 3.0)):
            ops.append(Op((0, 0), kind, (0, m), t, t + d))
            t += d
    return ops + [Op((0, 0), "ALLREDUCE", None, t, t + 4), Op((0, 0), "OPTIMIZER", None, t + 4, t + 9)]


def two_stage_ops() -> list[Op]:
    """One micro-batch through two stages (every op as early as the rules allow)."""
    return [
        Op((0, 0), "F", (0, 0), 0.0, 1.0),
        Op((0, 1), "F", (0, 0), 1.5, 2.5),
        Op((0, 1), "B", (0, 0), 2.5, 4.5),
        Op((0, 1), "W", (0, 0), 4.5, 7.5),
        Op((0, 1), "ALLREDUCE", None, 7.5, 11.5),
        Op((0, 1), "OPTIMIZER", None, 11.5, 16.5),
        Op((0, 0), "B", (0, 0), 5.0, 7.0),
        Op((0, 0), "W", (0, 0), 7.0, 10.0),
        Op((0, 0), "ALLREDUCE", None, 10.0, 14.0),
        Op((0, 0), "OPTIMIZER", None, 14.0, 19.0),
    ]


def test_one_worker_period_is_its_total_work(one_worker_job):
    ops = one_worker_ops()
    assert validate(one_worker_job, [], ops) == []
    report = replay(one_worker_job, ops)
    # 3 x (F + B + W) + all-reduce + optimizer = 3 x 6 + 4 + 5; no idle time at all.
    assert report.iteration_ms == pytest.approx(27.0)
    assert report.busy_ms[(0, 0)] == pytest.approx(27.0)
    assert report.idle_ms[(0, 0)] == pytest.approx(0.0)
    assert report.converged


def test_two_stage_period_is_stage_zero_round_trip(two_stage_job):
    ops = two_stage_ops()
    assert validate(two_stage_job, [], ops) == []
    report = replay(two_stage_job, ops)
    # Stage 0 restarts only after its own optimizer, and its iteration waits for the round trip:
    # F0 + hop + F1 + B1 + hop + B0 + W0 + AR0 + OPT0 = 1 + .5 + 1 + 2 + .5 + 2 + 3 + 4 + 5.
    assert report.iteration_ms == pytest.approx(19.0)
    assert report.busy_ms[(0, 1)] == pytest.approx(15.0)
    assert report.idle_ms[(0, 1)] == pytest.approx(4.0)


def test_planner_matches_the_hand_derived_periods(one_worker_job, two_stage_job):
    assert plan(one_worker_job, use_cp=False).iteration_ms == pytest.approx(27.0)
    assert plan(two_stage_job, use_cp=False).iteration_ms == pytest.approx(19.0)


def test_replayed_period_ignores_the_written_times(two_stage_job):
    # Only each worker's op order matters: delaying everything on stage 1 changes no period.
    ops = [Op(o.worker, o.kind, o.microbatch, o.start_ms + (3.0 if o.worker[1] else 0.0),
              o.end_ms + (3.0 if o.worker[1] else 0.0)) for o in two_stage_ops()]
    assert replay(two_stage_job, ops).iteration_ms == pytest.approx(19.0)


def test_jitter_changes_the_period_and_is_reproducible(failed_plan):
    job, ops = failed_plan.job, failed_plan.ops
    plain = replay(job, ops, iterations=20).iteration_ms
    a = replay(job, ops, iterations=20, jitter=0.1, seed=7).iteration_ms
    b = replay(job, ops, iterations=20, jitter=0.1, seed=7).iteration_ms
    c = replay(job, ops, iterations=20, jitter=0.1, seed=8).iteration_ms
    assert plain == pytest.approx(failed_plan.iteration_ms)
    assert a == b
    assert a != plain and a != c
    assert abs(a - plain) < 0.1 * plain  # jitter of +/-10% per op cannot move the mean more


def test_deadlocking_order_raises(two_stage_job):
    ops = two_stage_ops()
    # Stage 0 runs B (which needs the gradient from stage 1) before the F that stage 1 waits for.
    ops[0], ops[6] = Op((0, 0), "F", (0, 0), 5.0, 6.0), Op((0, 0), "B", (0, 0), 0.0, 2.0)
    with pytest.raises(ReplayError, match="deadlock"):
        replay(two_stage_job, ops)


def test_empty_plan_raises(two_stage_job):
    with pytest.raises(ReplayError):
        replay(two_stage_job, [])


def test_alternating_steady_state_reports_the_mean_period():
    import numpy as np

    from planner.simulator import settled_cycle

    # Two workers whose iterations alternate 10 ms and 12 ms (worked by hand): the steady state
    # repeats every 2 iterations and the period is their mean, 11 ms, not the last length.
    lengths = [14.0, 10.0, 12.0, 10.0, 12.0, 10.0, 12.0]
    increments = [np.array([x, x]) for x in lengths]
    assert settled_cycle(increments[:3]) == 0
    assert settled_cycle(increments) == 2
    ends = np.cumsum(lengths)
    cycle = settled_cycle(increments)
    assert (ends[-1] - ends[-1 - cycle]) / cycle == 11.0
    # A steady length-1 state is cycle 1; workers advancing unequally have not settled.
    assert settled_cycle([np.array([5.0, 5.0])] * 3) == 1
    assert settled_cycle([np.array([5.0, 6.0])] * 9) == 0


def test_a_replay_that_has_not_settled_says_so(two_stage_job):
    # Hand-worked: from all workers at 0, iteration 1 ends stage 0 at 19 and stage 1 at 16.5
    # (16.5 = 1.5 + 15: F0 + hop, then its own 15 ms); in iteration 2 stage 1 waits for F0 again,
    # so both advance 19. Two iterations show unequal advances (19 vs 16.5): not settled, cycle 0.
    early = replay(two_stage_job, two_stage_ops(), iterations=2)
    assert (early.converged, early.cycle) == (False, 0)
    assert early.iteration_end_ms == pytest.approx([19.0, 38.0])
    # The third iteration advances both by 19 again: settled with cycle 1, period 19.
    settled = replay(two_stage_job, two_stage_ops(), iterations=3)
    assert (settled.converged, settled.cycle, settled.iteration_ms) == (True, 1, pytest.approx(19.0))


def test_a_plan_whose_replay_did_not_settle_is_never_called_optimal(one_worker_job, make_job, monkeypatch):
    import planner.candidates
    from planner.fault_free import clear_memory_cache
    from planner.simulator import replay as real_replay

    # One worker: the heuristic's plan reaches the bound (27 ms, hand-worked above) and is optimal;
    assert plan(one_worker_job, use_cp=False).stats.status.value == "optimal"
    # so is two one-stage pipelines with one failed: the survivor runs 6 x 6 + 4 + 5 = 45 ms = bound.
    two = make_job(pipelines=2, stages=1, microbatches=3, **{k: v for k, v in UNIT.items() if "p2p" not in k})
    survivor = plan(two, [(1, 0)], use_cp=False)
    assert (survivor.iteration_ms, survivor.stats.status.value) == (pytest.approx(45.0), "optimal")
    # with the replay cut to 2 iterations (one advance from the start, one after) it cannot be
    # shown to have settled, so the plan must say so and not claim optimality.
    monkeypatch.setattr(planner.candidates, "replay", lambda job, ops: real_replay(job, ops, iterations=2))
    clear_memory_cache()
    try:
        results = [plan(one_worker_job, use_cp=False), plan(two, [(1, 0)], use_cp=False)]
    finally:
        clear_memory_cache()
    for result in results:
        assert result.stats.replay_settled is False and result.stats.replay_cycle == 0
        assert result.stats.status.value == "heuristic"
        assert result.timeline_json()["solver"]["replay_settled"] is False


def test_replay_uses_the_job_durations_not_the_written_ones(one_worker_job):
    """The validator accepts written durations within its tolerance; the replay times every op by
    the job spec (rule 2), so shaving each op by that tolerance does not shorten the period: one
    worker, 3 x (1 + 2 + 3) + 4 + 5 = 27 ms by hand."""
    shaved = [Op(op.worker, op.kind, op.microbatch, op.start_ms, op.end_ms - 5e-7) for op in one_worker_ops()]
    assert validate(one_worker_job, [], shaved) == []
    assert replay(one_worker_job, shaved).iteration_ms == 27.0


@pytest.mark.parametrize("walk", ["numpy", "python"])
def test_a_worker_still_busy_when_its_next_input_arrives_starts_when_free(make_job, monkeypatch, walk):
    """Stage 1's W (10 ms) ends after stage 0 has sent the next iteration's forward, so stage 1's
    first op waits for its own ready time, not only for its input. By hand: stage 1 runs F 1 + B 1
    + W 10 = 12 ms back to back each iteration, stage 0 only F + B + W = 3 plus the wait for its
    gradient, so the period is 12; a replay that forgets the ready time of a first op with an
    input (the whole graph walked either way) lets stage 1 overlap itself and reports 5."""
    threshold = 0 if walk == "numpy" else 10**12
    monkeypatch.setattr(simulator, "NUMPY_LEVELS_MIN_CHAINS", threshold)
    monkeypatch.setattr(simulator, "NUMPY_ITERATION_MIN_EDGES_PER_LEVEL", threshold)
    job = make_job(pipelines=1, stages=2, microbatches=1, forward_ms=1.0, backward_input_ms=1.0,
                   backward_weight_ms=[1.0, 10.0], p2p_ms=0.0, cross_pipeline_p2p_ms=0.0,
                   allreduce_ms=0.0, optimizer_ms=0.0)
    ops = [
        Op((0, 0), "F", (0, 0), 0.0, 1.0),
        Op((0, 1), "F", (0, 0), 1.0, 2.0),
        Op((0, 1), "B", (0, 0), 2.0, 3.0),
        Op((0, 1), "W", (0, 0), 3.0, 13.0),
        Op((0, 1), "ALLREDUCE", None, 13.0, 13.0),
        Op((0, 1), "OPTIMIZER", None, 13.0, 13.0),
        Op((0, 0), "B", (0, 0), 3.0, 4.0),
        Op((0, 0), "W", (0, 0), 4.0, 5.0),
        Op((0, 0), "ALLREDUCE", None, 5.0, 5.0),
        Op((0, 0), "OPTIMIZER", None, 5.0, 5.0),
    ]
    assert validate(job, [], ops) == []
    report = replay(job, ops)
    assert report.converged
    assert report.iteration_ms == pytest.approx(12.0)
