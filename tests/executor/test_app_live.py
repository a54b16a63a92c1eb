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
