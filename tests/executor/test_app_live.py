"""A user's training app (contracts.md, "Training app") on live worker processes: a mid-iteration
SIGKILL of a middle-stage worker and its rejoin must leave every iteration's loss and every final
parameter equal to plain single-process training of the same app (the contract's semantics,
implemented independently in `train_reference_app`)."""

from __future__ import annotations

import pytest
import torch

from executor.app import load_app
from executor.cluster import Fault, LiveCluster, Rejoin
from executor.local import uniform_job
from executor.model import ModelConfig
from executor.reference import train_reference_app
from executor.service import ServiceClient

pytestmark = pytest.mark.slow

APP = "tests.executor.apps.skipnet:app"
RTOL = 1e-5


def test_app_with_tuple_activations_survives_kill_and_rejoin_exactly(service):
    torch.set_num_threads(1)
    pipelines, stages, microbatches, iterations = 2, 3, 3, 6
    client = ServiceClient(service.url)
    job = client.create_job(uniform_job(pipelines, stages, microbatches).filled())
    client.precompute(job, 1, timeout_s=60)
    run = LiveCluster(service.url, job, pipelines, stages, microbatches, iterations, ModelConfig(),
                      faults=[Fault((1, 1), 2, "backward_input")], rejoins=[Rejoin((1, 1), 4)],
                      timeout_s=240, operation_timeout_s=30, app=APP).run()
    ref = train_reference_app(load_app(APP), stages, pipelines, microbatches, iterations)
    assert [g["failed"] for g in run.generations] == [[], [[1, 1]], []]
    assert len(run.losses) == iterations
    for it, (got, want) in enumerate(zip(run.losses, ref.losses, strict=True)):
        assert abs(got - want) <= RTOL * abs(want), f"iteration {it}: loss {got} vs single-process {want}"
    for s, (got, want) in enumerate(zip(run.stage_parameters, ref.stage_parameters, strict=True)):
        assert got.keys() == want.keys()
        for name, t in want.items():
            rel = float((got[name] - t).norm() / t.norm())
            assert rel <= RTOL, f"stage {s} {name}: relative difference {rel}"


def test_a_worker_whose_model_raises_is_dropped_and_the_run_stays_exact(service, tmp_path, monkeypatch):
    """A user's model that raises in one worker process (not a signal): the process exits with an
    error, the launcher reports it, the survivors re-plan without it and every loss and parameter
    still equals single-process training; the crashed worker's log tail (the traceback) is kept in
    the run's result, since the run's directory is gone when it ends."""
    torch.set_num_threads(1)
    app = "tests.executor.apps.crashing:app"
    pipelines, stages, microbatches, iterations = 2, 3, 3, 6
    ref = train_reference_app(load_app(app), stages, pipelines, microbatches, iterations)  # no crash here
    monkeypatch.setenv("CRASHING_MARKER", str(tmp_path / "crashed"))
    monkeypatch.setenv("CRASHING_AFTER", "7")  # the first forward of the third iteration
    client = ServiceClient(service.url)
    job = client.create_job(uniform_job(pipelines, stages, microbatches).filled())
    client.precompute(job, 1, timeout_s=60)
    run = LiveCluster(service.url, job, pipelines, stages, microbatches, iterations, ModelConfig(),
                      timeout_s=240, operation_timeout_s=30, app=app).run()
    assert (tmp_path / "crashed").exists()
    (crashed,) = run.crashed_logs
    assert crashed in ("0:1", "1:1")
    assert "crashing app: a bug in the model at forward 7" in run.crashed_logs[crashed]
    assert [g["failed"] for g in run.generations] == [[], [[int(crashed[0]), 1]]]
    for it, (got, want) in enumerate(zip(run.losses, ref.losses, strict=True)):
        assert abs(got - want) <= RTOL * abs(want), f"iteration {it}: loss {got} vs single-process {want}"
    for s, (got, want) in enumerate(zip(run.stage_parameters, ref.stage_parameters, strict=True)):
        for name, t in want.items():
            rel = float((got[name] - t).norm() / t.norm())
            assert rel <= RTOL, f"stage {s} {name}: relative difference {rel}"
