"""`recycle profile --app`: measure a training app's stages into the job spec the planner reads.

Per stage, on micro-batch 0 (its input made by running the earlier stages): F, B and W of one
micro-batch through the same `AppStageRunner` the workers use (median of `reps`), the optimizer
step, and the activation memory one micro-batch holds from F to B (the distinct storages autograd
saves, plus the outputs) and from B to W (`activation_w_mb`: the saved storages still alive once B
has run, i.e. what the weight gradient still needs under this executor's B/W split; B keeps the
graph for W, so today that is everything saved but the outputs). The transfer and all-reduce
figures come from loopback gloo (`executor.profile`).
"""

from __future__ import annotations

import copy
import gc
import statistics
import time
import weakref
from typing import Any

import torch

from executor.app import TrainingApp, as_tuple, build_stage, call_stage
from executor.app_stage import AppStageRunner, nbytes, signature_of
from executor.comms import torch_device
from executor.profile import allreduce_ms, job_spec_from_rows, p2p_ms


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class SavedTensors:
    """The distinct storages autograd saves while `record` runs; `alive_mb` tells how much of it is
    still referenced later (weak references: measuring must not keep anything alive)."""

    def __init__(self) -> None:
        self.seen: dict[Any, tuple[int, weakref.ref]] = {}

    def record(self, fn) -> Any:
        def pack(t: torch.Tensor) -> torch.Tensor:
            if not isinstance(t, torch.nn.Parameter):
                storage = t.untyped_storage()
                self.seen.setdefault((storage.data_ptr(), t.device), (storage.nbytes(), weakref.ref(t)))
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            return fn()

    def total_mb(self) -> float:
        return sum(n for n, _ in self.seen.values()) / 2**20

    def alive_mb(self, also: list[torch.Tensor] = ()) -> float:
        """Saved storages still alive, plus the distinct storages of `also` not among them."""
        alive = {key: n for key, (n, ref) in self.seen.items() if ref() is not None}
        for t in also:
            storage = t.untyped_storage()
            alive.setdefault((storage.data_ptr(), t.device), storage.nbytes())
        return sum(alive.values()) / 2**20


def profile_app_stage(app: TrainingApp, module: torch.nn.Module, stage: int, stages: int, x: Any,
                      target: Any, reps: int, device: torch.device) -> dict[str, float]:
    runner = AppStageRunner(module, app, stage, stages, 1.0)
    times: dict[str, list[float]] = {"F": [], "B": [], "W": []}
    out_signature = None
    saved_mb = held_after_b_mb = 0.0
    for i in range(reps + 1):
        mb = (0, i)
        saved = SavedTensors()
        _sync(device)
        t0 = time.perf_counter()
        out = saved.record(lambda: runner.forward(mb, x, target))  # noqa: B023
        _sync(device)
        t1 = time.perf_counter()
        grads = None
        if out is not None:
            out_signature = signature_of(out)
            grads = tuple(torch.ones_like(t) for t in out if t.dtype.is_floating_point)
        _sync(device)
        t2 = time.perf_counter()
        runner.backward_input(mb, grads)
        _sync(device)
        t3 = time.perf_counter()
        out = grads = None
        # Memory accounting between B and W, outside both timed windows: a full gc.collect() in a
        # process holding torch takes tens to hundreds of ms, which W's time used to include.
        gc.collect()
        saved_mb, held_after_b_mb = saved.total_mb(), saved.alive_mb(runner.tensors_held_for_w(mb))
        _sync(device)
        t4 = time.perf_counter()
        runner.backward_weight(mb)
        _sync(device)
        t5 = time.perf_counter()
        if i:  # the first round warms up
            times["F"].append(t1 - t0)
            times["B"].append(t3 - t2)
            times["W"].append(t5 - t4)
    optimizer = app.optimizer(module.parameters())
    step_times = []
    for _ in range(reps):
        _sync(device)
        t0 = time.perf_counter()
        optimizer.step()
        _sync(device)
        step_times.append(time.perf_counter() - t0)
    out_mb = nbytes(out_signature) / 2**20 if out_signature else 0.0
    row = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    row["optimizer"] = statistics.median(step_times) * 1e3
    row["activation_mb"] = saved_mb + out_mb
    row["activation_w_mb"] = min(held_after_b_mb, row["activation_mb"])
    row["output_bytes"] = nbytes(out_signature) if out_signature else 0
    return row


def profile_app(app: TrainingApp, pipelines: int, stages: int, microbatches: int, reps: int = 5,
                device: str = "cpu") -> dict[str, Any]:
    """Measure every stage of `app` and return a contract job spec (checked by the planner)."""
    if reps < 1:
        raise ValueError(f"reps: must be >= 1, got {reps}")
    dev = torch_device(device)
    modules = [build_stage(app, s, stages).to(dev) for s in range(stages)]
    x, target = app.microbatch(0, 0, pipelines * microbatches)
    from executor.app_stage import to_device

    x, target = to_device(x, dev), to_device(target, dev)
    rows, value = [], x
    for s, module in enumerate(modules):
        stage_input = value if s == 0 else tuple(t.detach() for t in as_tuple(value))
        rows.append(profile_app_stage(app, copy.deepcopy(module), s, stages, stage_input,
                                      target if s == stages - 1 else None, reps, dev))
        with torch.no_grad():
            value = module(value) if s == 0 else call_stage(module, stage_input)
        rows[-1]["allreduce"] = allreduce_ms(sum(p.numel() for p in module.parameters()), pipelines, reps)
    largest = max(r["output_bytes"] for r in rows)
    hop = p2p_ms(max(1, largest // 4), reps)
    return job_spec_from_rows(rows, pipelines, stages, microbatches, hop)
