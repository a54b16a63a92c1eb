"""Live failures against the real service: real worker processes, real signals, real recovery.

One `recycle serve` subprocess (SQLite in tmp) serves every case of the module. Each case trains
with `LiveCluster`, injects SIGKILL / SIGSTOP at an exact phase of an iteration, and compares
losses and final parameters with plain single-process training on the same global batches: every
micro-batch must count exactly once whatever died, when, and who came back.
"""

from __future__ import annotations

import pytest

from executor.cluster import Fault, LiveCluster, LiveRunError, Rejoin
from executor.local import uniform_job
from executor.service import ServiceClient
from tests.executor.references import reference as reference_training
from tests.executor.references import tiny

pytestmark = pytest.mark.slow

M = 4
RTOL = 1e-5


@pytest.fixture(scope="module")
def reference():
    return lambda pipelines, stages, iterations: reference_training(pipelines, stages, M, iterations)


def live(service, pipelines, stages, iterations, faults=(), rejoins=(), agent_reports=True, **options):
    client = ServiceClient(service.url)
    job = client.create_job(uniform_job(pipelines, stages, M).filled())
    client.precompute(job, len(faults), timeout_s=60)
    return LiveCluster(service.url, job, pipelines, stages, M, iterations, tiny(stages), faults=list(faults),
                       rejoins=list(rejoins), agent_reports=agent_reports, timeout_s=240,
                       operation_timeout_s=30, **options)


def assert_same(run_losses, run_params, ref):
    assert len(run_losses) == len(ref.losses)
    for it, (a, b) in enumerate(zip(run_losses, ref.losses, strict=True)):
        assert abs(a - b) <= RTOL * abs(b), f"iteration {it}: loss {a} vs reference {b}"
    for s, (got, want) in enumerate(zip(run_params, ref.stage_parameters, strict=True)):
        for name, t in want.items():
            rel = float((got[name] - t).norm() / t.norm())
            assert rel <= RTOL, f"stage {s} {name}: relative difference {rel}"


@pytest.mark.parametrize(("pipelines", "stages"), [(3, 2), (2, 3)], ids=["3x2", "2x3"])
def test_kill_mid_iteration_3_and_rejoin_at_6_equals_single_process(service, reference, pipelines, stages):
    # 2x3: worker 1:1 is a middle stage (receives from stage 0 and sends to stage 2), so its
    # re-routed micro-batches cross pipelines in both directions.
    run = live(service, pipelines, stages, 8, [Fault((1, 1), 3, "forward")], [Rejoin((1, 1), 6)]).run()
    assert_same(run.losses, run.stage_parameters, reference(pipelines, stages, 8))
    assert [g["failed"] for g in run.generations] == [[], [[1, 1]], []]
    assert [g["restart"] for g in run.generations] == [0, 3, 6]
    assert [r["generation"] for r in run.iterations] == [1, 1, 1, 2, 2, 2, 3, 3]
    (failure,) = run.failures
    assert failure["worker"] == [1, 1] and failure["iteration"] == 3 and failure["recovery_ms"] is not None


def test_two_failures_at_once_in_different_stages_detected_by_the_survivors(service, reference):
    # No agent reports: the survivors' broken connections and the heartbeat timeout must do it.
    run = live(service, 3, 2, 8, [Fault((1, 1), 3, "forward"), Fault((2, 0), 3, "forward")],
               agent_reports=False).run()
    assert_same(run.losses, run.stage_parameters, reference(3, 2, 8))
    assert run.generations[-1]["failed"] == [[1, 1], [2, 0]]
    assert all(r["generation"] == 1 for r in run.iterations[:3])


@pytest.mark.parametrize("phase", ["backward_input", "backward_weight", "allreduce", "optimizer"])
def test_kill_in_each_phase_reruns_the_iteration_exactly(service, reference, phase):
    run = live(service, 2, 2, 4, [Fault((1, 1), 2, phase)]).run()
    assert_same(run.losses, run.stage_parameters, reference(2, 2, 4))
    assert run.generations[-1]["failed"] == [[1, 1]]


def test_kill_two_workers_of_one_stage(service, reference):
    both = [Fault((0, 1), 2, "backward_input"), Fault((1, 1), 2, "backward_input")]
    run = live(service, 3, 2, 4, both).run()
    assert_same(run.losses, run.stage_parameters, reference(3, 2, 4))
    assert run.generations[-1]["failed"] == [[0, 1], [1, 1]]


def test_a_lost_stage_nobody_rejoins_stops_cleanly_with_consistent_state(service, reference):
    # Survivors wait this long for a worker to rejoin stage 1, then stop.
    cluster = live(service, 2, 2, 4, [Fault((0, 1), 1, "forward"), Fault((1, 1), 1, "forward")],
                   stage_lost_wait_s=3.0)
    with pytest.raises(LiveRunError, match="stage 1 has no alive worker.*none came within 3 s") as info:
        cluster.run()
    survivors = info.value.partial
    assert sorted(survivors) == [(0, 0), (1, 0)]
    for out in survivors.values():
        assert out["error"].startswith("TrainingStopped")
        # Nothing half-applied: each survivor holds exactly the state after `completed` steps.
        done = out["completed"]
        want = reference_training(2, 2, M, done).stage_parameters[0] if done else None
        for name, t in out["parameters"].items():
            if want is not None:
                assert float((t - want[name]).norm() / want[name].norm()) <= RTOL


def test_hung_worker_is_detected_by_heartbeat(service, reference):
    run = live(service, 2, 2, 4, [Fault((1, 1), 2, "forward", signal="stop")]).run()
    assert_same(run.losses, run.stage_parameters, reference(2, 2, 4))
    assert run.generations[-1]["failed"] == [[1, 1]]
    assert "missed heartbeats" in run.generations[-1]["reason"]


@pytest.mark.parametrize("at", [2, 30], ids=["mid-run", "last-iteration"])
def test_a_live_worker_declared_failed_rejoins_by_itself(service, reference, at):
    """An operator's report (final, unlike a peer's suspicion) excludes 1:1 while it is alive and
    training: it must drop its state, rejoin, get the stage's parameters from 0:1, and the run
    must stay exact - no process restart, no iteration lost or counted twice. At the last
    iteration the report races the end of training: some workers may already have finished and
    left, and the others must still finish rather than wait for them to come back."""
    client = ServiceClient(service.url)
    cluster = live(service, 2, 2, 30)  # ~0.1 s an iteration: the report lands well inside the run
    # Its plan ready in advance, so the new generation settles at once rather than after a solve
    # that a loaded machine can make outlast the run.
    client.precompute(cluster.job_id, 1, timeout_s=60)
    reported = []

    def exclude_once(completed: int) -> None:
        if completed >= at and not reported:
            client.report_failure(cluster.job_id, (1, 1), "operator: drained for maintenance")
            reported.append(completed)

    run = cluster.run(progress=exclude_once)
    assert reported, f"training never reached iteration {at}"
    assert_same(run.losses, run.stage_parameters, reference(2, 2, 30))
    if at < 30:
        # The generation that excluded it may be superseded by its rejoin before anyone runs it.
        reasons = [g["reason"] for g in run.generations]
        assert len(reasons) >= 2 and "worker [1, 1] rejoined" in reasons[-1], (reasons, run.crashed_logs)
        assert run.generations[-1]["failed"] == []
