"""Trace files, Poisson traces and the day simulation on a one-stage job (periods known by hand)."""

from __future__ import annotations

import pytest

from evaluation.strategies import Evaluator, PauseModel
from evaluation.trace import Event, TraceError, poisson_trace, read_trace, simulate_day, write_trace
from planner.spec import JobSpec

JOB = JobSpec.parse({
    "pipelines": 4, "stages": 1, "microbatches": 3, "forward_ms": 1.0, "backward_input_ms": 2.0,
    "backward_weight_ms": 3.0, "p2p_ms": 0.0, "allreduce_ms": 5.0, "optimizer_ms": 1.0,
    "activation_mb": 1.0,
})
FAULT_FREE = 12 / 0.024  # 12 micro-batches per 24 ms
ONE_DOWN = 12 / 0.030  # 4 micro-batches on each of 3 survivors


def test_trace_file_round_trip(tmp_path):
    events = [Event(0.5, (1, 0), "fail"), Event(12.25, (1, 0), "rejoin"), Event(3.0, (2, 0), "fail")]
    path = tmp_path / "t.csv"
    write_trace(path, events)
    assert read_trace(path, JOB) == sorted(events)


@pytest.mark.parametrize("body, message", [
    ("time_s,pipeline,stage\n", "line 1 must be the header"),
    ("time_s,pipeline,stage,event\n1,0,0\n", "line 2: expected 4 fields"),
    ("time_s,pipeline,stage,event\nx,0,0,fail\n", "line 2: time_s must be a number"),
    ("time_s,pipeline,stage,event\n1,9,0,fail\n", "line 2: worker [9, 0] is outside"),
    ("time_s,pipeline,stage,event\n1,0,0,boom\n", "line 2: event must be fail or rejoin"),
    ("time_s,pipeline,stage,event\n-1,0,0,fail\n", "line 2: time_s must be a finite number >= 0"),
])
def test_bad_trace_files_name_the_line(tmp_path, body, message):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(TraceError, match=message.replace("[", r"\[").replace("]", r"\]")):
        read_trace(path, JOB)


def test_missing_trace_file_is_a_trace_error(tmp_path):
    with pytest.raises(TraceError, match="cannot read"):
        read_trace(tmp_path / "none.csv", JOB)


def test_poisson_trace_is_deterministic_by_seed():
    a = poisson_trace(JOB, 24, 10, 1, seed=3)
    assert a == poisson_trace(JOB, 24, 10, 1, seed=3)
    assert a != poisson_trace(JOB, 24, 10, 1, seed=4)
    assert all(0 <= e.time_s < 24 * 3600 for e in a)
    for worker in JOB.workers():  # alternating fail / rejoin, a repair time apart
        mine = [e for e in a if e.worker == worker]
        assert [e.kind for e in mine] == ["fail", "rejoin"] * (len(mine) // 2) + ["fail"] * (len(mine) % 2)
        for f, r in zip(mine[::2], mine[1::2], strict=False):
            assert r.time_s - f.time_s == pytest.approx(3600.0)


def test_poisson_rate_matches_the_mtbf():
    job = JobSpec.parse({**JOB.model_dump(), "pipelines": 50})
    fails = sum(e.kind == "fail" for e in poisson_trace(job, 100, 50, 0.0, seed=0))
    assert 60 < fails < 140  # expected 50 workers x 100 h / 50 h = 100


@pytest.mark.parametrize("hours, mtbf, repair", [(0, 1, 1), (1, -1, 1), (1, 1, -1), (float("nan"), 1, 1)])
def test_bad_poisson_options(hours, mtbf, repair):
    with pytest.raises(TraceError):
        poisson_trace(JOB, hours, mtbf, repair)


def test_day_with_one_failure_and_rejoin_by_hand():
    pauses = PauseModel(detect_s=10, regroup_s=5, oobleck_copy_s=20, restart_s=100,
                        checkpoint_interval_s=1000)
    ev = Evaluator(JOB, pauses)
    events = [Event(1500.0, (1, 0), "fail"), Event(2500.0, (1, 0), "rejoin")]
    days, lookups = simulate_day(ev, events, 4000.0, ["adaptive", "drop", "checkpoint"], progress=False)
    # adaptive: fault-free 0..1500, paused 15 s, one-down until 2500, paused 5 s, fault-free to 4000
    expected = 1500 * FAULT_FREE + 985 * ONE_DOWN + 1495 * FAULT_FREE
    assert days["adaptive"].useful_microbatches() == pytest.approx(expected)
    assert days["adaptive"].time_in_plan_s["paused"] == pytest.approx(20.0)
    assert lookups.precomputed == 2 and lookups.solved_live == 0
    # drop: the same numbers here (one stage: 12 micro-batches on 3 pipelines, 4 each)
    assert days["drop"].useful_microbatches() == pytest.approx(expected)
    # checkpoint: loses 1000..1500, paused 10 + 100 s, then fault-free on a spare; the rejoin is free
    assert days["checkpoint"].useful_microbatches() == pytest.approx((1000 + 4000 - 1610) * FAULT_FREE)
    assert days["checkpoint"].restarts == 1 and days["checkpoint"].lost_s == pytest.approx(500.0)


def test_unplannable_failure_set_restarts_with_spares():
    pauses = PauseModel(detect_s=0, regroup_s=0, oobleck_copy_s=0, restart_s=50, checkpoint_interval_s=100)
    ev = Evaluator(JobSpec.parse({**JOB.model_dump(), "pipelines": 1}), pauses)
    days, _ = simulate_day(ev, [Event(250.0, (0, 0), "fail")], 1000.0, ["adaptive"], progress=False)
    day = days["adaptive"]
    rate = 3 / 0.024
    assert day.restarts == 1 and day.lost_s == pytest.approx(50.0)
    assert day.useful_microbatches() == pytest.approx((200 + 700) * rate)


def test_live_solves_are_counted_and_reused():
    ev = Evaluator(JobSpec.parse({**JOB.model_dump(), "pipelines": 6}))
    events = [Event(10.0, (0, 0), "fail"), Event(20.0, (1, 0), "fail"), Event(30.0, (1, 0), "rejoin"),
              Event(40.0, (2, 0), "fail")]
    _, lookups = simulate_day(ev, events, 100.0, ["adaptive"], precompute_k=1, progress=False)
    assert (lookups.precomputed, lookups.solved_live, lookups.reused) == (2, 1, 1)


def test_binned_throughput_averages_each_bin():
    ev = Evaluator(JOB)
    days, _ = simulate_day(ev, [], 100.0, ["adaptive"], progress=False)
    assert days["adaptive"].binned(100.0, 30.0) == pytest.approx([FAULT_FREE] * 4)
