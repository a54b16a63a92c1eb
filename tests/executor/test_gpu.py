"""The GPU path: CUDA-event op timing and a live NCCL run with a kill and a rejoin. These need CUDA
(and one GPU per worker for NCCL) and are skipped, with the reason shown, on a host without."""

from __future__ import annotations

import pytest
import torch

from executor.timing import OpTimer

GPUS = torch.cuda.device_count() if torch.cuda.is_available() else 0
needs_cuda = pytest.mark.skipif(GPUS == 0, reason="no CUDA device on this host")


def test_cpu_timer_adds_wall_time_per_op():
    timer = OpTimer(torch.device("cpu"))
    for _ in range(2):
        started = timer.start()
        torch.ones(256, 256) @ torch.ones(256, 256)
        timer.stop("F", started)
    timer.flush()
    assert set(timer.seconds) == {"F"} and timer.seconds["F"] > 0


@needs_cuda
def test_cuda_timer_measures_the_kernels_not_their_launch():
    """A large matmul takes far longer on the GPU than its launch: the event time must see it."""
    device = torch.device("cuda", 0)
    a = torch.randn(4096, 4096, device=device)
    timer = OpTimer(device)
    torch.cuda.synchronize()
    started = timer.start()
    for _ in range(8):
        a = a @ a / 64
    timer.stop("F", started)
    timer.flush()
    # 8 x 2 x 4096^3 flops: at most ~1,000 TFLOP/s on any current GPU, so >= 1 ms.
    assert timer.seconds["F"] >= 1e-3


@pytest.mark.skipif(GPUS < 4, reason=f"NCCL needs one GPU per worker: 4 wanted, {GPUS} here")
def test_live_nccl_run_with_a_kill_and_a_rejoin_matches_single_process(service):
    from executor.app import load_app
    from executor.cluster import Fault, LiveCluster, Rejoin
    from executor.local import uniform_job
    from executor.model import ModelConfig
    from executor.reference import train_reference_app
    from executor.service import ServiceClient

    app = "tests.executor.apps.skipnet:app"
    client = ServiceClient(service.url)
    job = client.create_job(uniform_job(2, 2, 2).filled())
    client.precompute(job, 1, timeout_s=60)
    kill = Fault((1, 1), 2, "backward_input")
    run = LiveCluster(service.url, job, 2, 2, 2, 6, ModelConfig(), faults=[kill],
                      rejoins=[Rejoin((1, 1), 4)], timeout_s=240, operation_timeout_s=30, app=app,
                      device="cuda").run()
    ref = train_reference_app(load_app(app), 2, 2, 2, 6)
    for got, want in zip(run.losses, ref.losses, strict=True):
        assert abs(got - want) <= 1e-4 * abs(want)  # GPU kernels differ from CPU in the last bits


@needs_cuda
def test_a_host_input_reaches_the_gpu_intact_without_blocking_on_queued_kernels():
    """`to_device` copies from pinned memory with non_blocking (so it does not wait for the kernels
    already queued); the values must arrive intact, and a later kernel on the same stream sees them."""
    from executor.app_stage import to_device

    device = torch.device("cuda", 0)
    busy = torch.randn(4096, 4096, device=device)
    for _ in range(4):
        busy = busy @ busy / 64  # queued work the copy must not wait for, nor overtake wrongly
    batch = (torch.arange(4096, dtype=torch.int64).reshape(8, 512), {"y": torch.ones(3)})
    moved = to_device(batch, device)
    assert moved[0].device == device and moved[1]["y"].device == device
    assert torch.equal(moved[0].cpu(), batch[0]) and torch.equal(moved[1]["y"].cpu(), batch[1]["y"])
    assert int((moved[0] + 1).sum()) == int((batch[0] + 1).sum())


@needs_cuda
def test_a_host_snapshot_holds_the_state_it_was_taken_from_though_the_step_is_queued_at_once():
    """A GPU replica's snapshot lives in pinned host memory and is copied on a side stream; the
    next step is queued right behind it and must not overwrite the state before the copy read it
    (`before_step`). A 256 MB state keeps the copy in flight while the step is queued."""
    from torch import nn

    from executor.app_stage import ReplicaState

    device = torch.device("cuda", 0)
    torch.manual_seed(0)
    module = nn.Linear(8192, 8192, bias=False).to(device)
    replica = ReplicaState(module, torch.optim.AdamW(module.parameters(), lr=0.1), host_memory=True)

    def step() -> None:
        module.weight.grad = torch.randn_like(module.weight)
        replica.before_step()
        replica.optimizer.step()

    step()  # the optimizer has its moments from here on
    torch.cuda.synchronize()
    taken = {k: v.clone() for k, v in module.state_dict().items()}
    moments = {k: v.clone() for k, v in replica.optimizer.state_dict()["state"][0].items()}
    allocated = torch.cuda.memory_allocated(device)
    snap = replica.snapshot()
    assert torch.cuda.memory_allocated(device) - allocated < 2**20  # no GPU copy of 3 x 256 MB
    assert all(b.device.type == "cpu" and b.is_pinned() for b in snap.buffers if b.numel() > 1)
    step()
    step()
    replica.restore(snap)
    assert all(torch.equal(module.state_dict()[k], v) for k, v in taken.items())
    got = replica.optimizer.state_dict()["state"][0]
    assert all(torch.equal(got[k].cpu(), v.cpu()) for k, v in moments.items())
    assert got["exp_avg"].device == device  # the optimizer moved its restored moments back
