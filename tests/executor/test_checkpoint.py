"""Checkpoints (contracts.md: `DIR/step-{k}`, keys `stages.{s}.{name}`): the newest complete one is
never a half-written directory, a live run with a kill and a rejoin leaves checkpoints whose
parameters (read back in one process, no process group) equal single-process training at the same
iteration, and a run resumed from one continues exactly as the uninterrupted run."""

from __future__ import annotations

import warnings

import pytest
import torch

from executor.app import build_stage, load_app
from executor.checkpoint import CheckpointWriter, latest_complete, load_parameters, load_stage
from executor.cluster import Fault, LiveCluster, Rejoin
from executor.local import uniform_job
from executor.model import ModelConfig
from executor.reference import train_reference_app
from executor.service import ServiceClient

APP = "tests.executor.apps.skipnet:app"
warnings.filterwarnings("ignore", message=".*torch.distributed.*")


def test_only_finished_checkpoints_count(tmp_path):
    app = load_app(APP)
    modules = [build_stage(app, s, 2) for s in range(2)]
    optimizers = [app.optimizer(m.parameters()) for m in modules]
    writers = [CheckpointWriter(tmp_path, s, 2) for s in range(2)]
    for s in (1, 0):
        writers[s].save(3, modules[s], optimizers[s])
    for w in writers:
        w.flush(60)
    assert [w.errors for w in writers] == [[], []]
    # Leftovers of crashed writes: a half-written DCP dir, an unassembled step, a step without metadata.
    (tmp_path / ".step-9.tmp").mkdir()
    (tmp_path / ".step-8.parts").mkdir()
    (tmp_path / "step-7").mkdir()
    assert latest_complete(tmp_path) == (3, tmp_path / "step-3")
    names = {f"stages.{s}.{k}" for s in range(2) for k in modules[s].state_dict()}
    got = load_parameters(tmp_path / "step-3", {n: torch.zeros(1) for n in ()} | {
        f"stages.{s}.{k}": v for s in range(2) for k, v in modules[s].state_dict().items()})
    assert set(got) == names
    fresh = build_stage(app, 1, 2)
    with torch.no_grad():
        for p in fresh.parameters():
            p.add_(1.0)
    assert load_stage(tmp_path / "step-3", 1, fresh, app.optimizer(fresh.parameters())) == 3
    for k, v in modules[1].state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v)


def _cluster(service, iterations, checkpoints, faults=(), rejoins=(), resume=False, precompute=None):
    client = ServiceClient(service.url)
    job = client.create_job(uniform_job(2, 2, 2).filled())
    client.precompute(job, len(faults) if precompute is None else precompute, timeout_s=60)
    return LiveCluster(service.url, job, 2, 2, 2, iterations, ModelConfig(), faults=list(faults),
                       rejoins=list(rejoins), timeout_s=240, operation_timeout_s=30, app=APP,
                       checkpoint_dir=str(checkpoints), checkpoint_every=2, resume=resume)


def _assert_close(got: dict, want: dict):
    for name, t in want.items():
        rel = float((got[name] - t).norm() / t.norm())
        assert rel <= 1e-5, f"{name}: relative difference {rel}"


@pytest.mark.slow
def test_live_checkpoints_equal_single_process_training_and_resume_continues_exactly(service, tmp_path):
    torch.set_num_threads(1)
    ref = train_reference_app(load_app(APP), 2, 2, 2, 8)
    first = _cluster(service, 6, tmp_path, [Fault((1, 1), 3, "backward_weight")], [Rejoin((1, 1), 5)]).run()
    assert [g["failed"] for g in first.generations] == [[], [[1, 1]], []]
    assert latest_complete(tmp_path)[0] == 6
    at4 = train_reference_app(load_app(APP), 2, 2, 2, 4)
    for step, want in ((4, at4), (6, train_reference_app(load_app(APP), 2, 2, 2, 6))):
        template = {f"stages.{s}.{k}": v for s, params in enumerate(want.stage_parameters)
                    for k, v in params.items()}
        got = load_parameters(tmp_path / f"step-{step}", template)
        _assert_close(got, template)
    assert at4.losses == ref.losses[:4]
    resumed = _cluster(service, 8, tmp_path, resume=True).run()
    assert [r["iteration"] for r in resumed.iterations] == [6, 7]
    for got, want in zip([r["loss"] for r in resumed.iterations], ref.losses[6:], strict=True):
        assert abs(got - want) <= 1e-5 * abs(want)
    for s in range(2):
        _assert_close(resumed.stage_parameters[s], ref.stage_parameters[s])


@pytest.mark.slow
def test_losing_a_whole_stage_restores_every_worker_from_the_newest_checkpoint(service, tmp_path):
    """Both replicas of stage 1 are killed mid-iteration 5 (5 steps done, checkpoints every 2): no
    alive worker holds stage 1's state, so the job waits for a rejoin and then every worker, stage 0's
    survivors included, restores the newest complete checkpoint (step 4, or step 2 if step 4 was still
    being assembled) and reruns from there. Losses and final parameters equal the uninterrupted run."""
    torch.set_num_threads(1)
    ref = train_reference_app(load_app(APP), 2, 2, 2, 8)
    both = [Fault((0, 1), 5, "backward_input"), Fault((1, 1), 5, "backward_input")]
    run = _cluster(service, 8, tmp_path, both, [Rejoin((0, 1), 6), Rejoin((1, 1), 6)], precompute=1).run()
    restores = [g for g in run.generations if g["restored"] is not None]
    assert len(restores) == 1 and restores[0]["restored"] in (2, 4), run.generations
    assert restores[0]["restart"] == restores[0]["restored"]  # not the in-memory rollback point 5
    assert [r["iteration"] for r in run.iterations] == list(range(8))
    for it, (got, want) in enumerate(zip([r["loss"] for r in run.iterations], ref.losses, strict=True)):
        assert abs(got - want) <= 1e-5 * abs(want), f"iteration {it}: {got} vs {want}"
    for s in range(2):
        _assert_close(run.stage_parameters[s], ref.stage_parameters[s])
    template = {f"stages.{s}.{k}": v for s, params in enumerate(ref.stage_parameters)
                for k, v in params.items()}
    _assert_close(load_parameters(tmp_path / "step-8", template), template)


@pytest.mark.slow
def test_a_job_that_loses_every_worker_still_reports_every_iteration(service, tmp_path):
    """A one-pipeline job (1 x 2) whose two workers are both killed mid-iteration 3 (checkpoints
    every 2) and back at iteration 4. The killed processes' results die with them, so iterations 0-2
    and generation 1 are known only from what they posted to the launcher's store: every iteration
    must still be reported, with a positive duration, and the first generation and the restore
    listed. (The launcher once raised here: no finished process held a record of iterations 0-2.)"""
    torch.set_num_threads(1)
    ref = train_reference_app(load_app(APP), 2, 1, 2, 6)  # stages, pipelines
    client = ServiceClient(service.url)
    job = client.create_job(uniform_job(1, 2, 2).filled())
    client.precompute(job, 2, timeout_s=60)
    both = [(0, 0), (0, 1)]
    run = LiveCluster(service.url, job, 1, 2, 2, 6, ModelConfig(),
                      faults=[Fault(w, 3, "backward_input") for w in both],
                      rejoins=[Rejoin(w, 4) for w in both], timeout_s=240, operation_timeout_s=30, app=APP,
                      checkpoint_dir=str(tmp_path), checkpoint_every=2, stage_lost_wait_s=60).run()
    assert [r["iteration"] for r in run.iterations] == list(range(6))
    assert all(r["iteration_ms"] > 0 for r in run.iterations), run.iterations
    first, *later = run.generations
    assert first["generation"] == 1 and first["restart"] == 0 and first["restored"] is None, run.generations
    restores = [g for g in later if g["restored"] is not None]
    # Step 2 is written after iteration 1; if the kill beat its writer, the initial state (step 0).
    # Each rejoin that finds a stage without state restores again (it cannot have moved on since).
    steps = {g["restored"] for g in restores}
    assert len(steps) == 1 and steps <= {0, 2}, run.generations
    step, redo = steps.pop(), restores[-1]["generation"]
    # Iterations before the restored step ran once, in generation 1; the rest were redone.
    assert [r["generation"] for r in run.iterations] == [1] * step + [redo] * (6 - step), run.iterations
    for it, (got, want) in enumerate(zip(run.losses, ref.losses, strict=True)):
        assert abs(got - want) <= 1e-5 * abs(want), f"iteration {it}: {got} vs {want}"
    for s in range(2):
        _assert_close(run.stage_parameters[s], ref.stage_parameters[s])
    # A kill is detected by a generation that starts after it, never by one from before it (the
    # second kill here can land once a generation without the first victim has begun).
    assert all(f["detected_ms"] is None or f["detected_ms"] > 0 for f in run.failures), run.failures
