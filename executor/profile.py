"""`recycle profile`: measure a model config on this machine and write the planner's job spec.

Per stage, on this process's device: F, B and W of one micro-batch (the same split code the workers
run), the AdamW step, and the activation memory (bytes of the tensors autograd saves in F plus the
stage output, which is what a micro-batch holds until its W). Communication on loopback gloo,
with one thread per rank in this process: one activation-sized send/recv (p2p_ms; the same
figure serves cross_pipeline_p2p_ms on one machine) and the stage's gradient all-reduce over D
ranks. Every figure is the median of `reps` timed repetitions after warm-up.
"""

from __future__ import annotations

import datetime
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from executor.comms import torch_device
from executor.data import DataConfig
from executor.model import ConfigError, ModelConfig, StageModule
from executor.optim import OptimConfig, make_optimizer
from executor.split_backward import WeightGradStore
from planner.spec import JobSpec

WARMUP = 2


def _median_ms(fn: Callable[[], float], reps: int) -> float:
    """`fn` runs one repetition and returns its own measured seconds."""
    times = [fn() for _ in range(reps + WARMUP)][WARMUP:]
    return statistics.median(times) * 1e3


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _stage_inputs(module: StageModule, cfg: ModelConfig, batch: int, device: torch.device):
    gen = torch.Generator().manual_seed(0)
    if module.first:
        x = torch.randint(0, cfg.vocab, (batch, cfg.seq_len), generator=gen)
    else:
        x = torch.randn(batch, cfg.seq_len, cfg.width, generator=gen)
    y = torch.randint(0, cfg.vocab, (batch, cfg.seq_len), generator=gen) if module.last else None
    grad = None if module.last else torch.randn(batch, cfg.seq_len, cfg.width, generator=gen).to(device)
    return x.to(device), (y.to(device) if y is not None else None), grad


def profile_stage(module: StageModule, cfg: ModelConfig, batch: int, reps: int, device: torch.device) -> dict:
    """F, B, W, optimizer (ms) and activation memory (MB) of one stage."""
    x, y, grad = _stage_inputs(module, cfg, batch, device)
    timings: dict[str, list[float]] = {"F": [], "B": [], "W": []}

    def one_microbatch() -> None:
        store = WeightGradStore()
        inp = x if module.first else x.detach().requires_grad_(True)
        _sync(device)
        t0 = time.perf_counter()
        out = module(inp, y, store)
        _sync(device)
        t1 = time.perf_counter()
        if module.first:
            out.backward(grad)
        else:
            torch.autograd.grad(out, inp, grad)
        _sync(device)
        t2 = time.perf_counter()
        store.flush()
        _sync(device)
        t3 = time.perf_counter()
        for key, value in (("F", t1 - t0), ("B", t2 - t1), ("W", t3 - t2)):
            timings[key].append(value)

    for _ in range(reps + WARMUP):
        one_microbatch()
    f_ms, b_ms, w_ms = (statistics.median(timings[k][WARMUP:]) * 1e3 for k in ("F", "B", "W"))

    opt = make_optimizer(module, OptimConfig())
    for p in module.parameters():
        p.grad = torch.full_like(p, 1e-3)

    def step() -> float:
        _sync(device)
        t0 = time.perf_counter()
        opt.step()
        _sync(device)
        return time.perf_counter() - t0

    opt_ms = _median_ms(step, reps)
    module.zero_grad(set_to_none=True)
    return {"F": f_ms, "B": b_ms, "W": w_ms, "optimizer": opt_ms,
            "activation_mb": activation_mb(module, x, y)}


def activation_mb(module: StageModule, x: torch.Tensor, y: torch.Tensor | None) -> float:
    """Distinct storages autograd saves during F, plus the output: held from F until W."""
    seen: dict[Any, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        if isinstance(t, torch.nn.Parameter) or (t.requires_grad and t.grad_fn is None and t.is_leaf):
            return t  # parameters are not activation memory
        storage = t.untyped_storage()
        seen[(storage.data_ptr(), t.device)] = storage.nbytes()
        return t

    store = WeightGradStore()
    inp = x if module.first else x.detach().requires_grad_(True)
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = module(inp, y, store)
    total = sum(seen.values()) + out.numel() * out.element_size()
    return total / 2**20


def _threaded_gloo(size: int, body: Callable[[dist.ProcessGroup, int], float]) -> float:
    """Run `body(group, rank)` on `size` gloo ranks (threads of this process); rank 0's seconds."""
    store = dist.HashStore()
    results: dict[int, float] = {}
    errors: list[BaseException] = []

    def run(rank: int) -> None:
        try:
            pg = dist.ProcessGroupGloo(store, rank, size, datetime.timedelta(seconds=60))
            results[rank] = body(pg, rank)
        except BaseException as exc:  # surfaced below, in the caller's thread
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    if errors or 0 not in results:
        raise RuntimeError(f"loopback gloo measurement failed: {errors[0] if errors else 'timeout'}")
    return results[0]


def p2p_ms(numel: int, reps: int) -> float:
    """One-way time of one activation-sized transfer: half a ping-pong round trip."""

    def body(pg: dist.ProcessGroup, rank: int) -> float:
        buf = torch.zeros(numel)
        times = []
        for i in range(reps + WARMUP):
            t0 = time.perf_counter()
            if rank == 0:
                pg.send([buf], 1, i).wait()
                pg.recv([buf], 1, i).wait()
            else:
                pg.recv([buf], 0, i).wait()
                pg.send([buf], 0, i).wait()
            times.append((time.perf_counter() - t0) / 2)
        return statistics.median(times[WARMUP:])

    return _threaded_gloo(2, body) * 1e3


def allreduce_ms(numel: int, ranks: int, reps: int) -> float:
    if ranks < 2:
        return 0.0

    def body(pg: dist.ProcessGroup, rank: int) -> float:
        buf = torch.ones(numel)
        times = []
        for _ in range(reps + WARMUP):
            t0 = time.perf_counter()
            pg.allreduce([buf]).wait()
            times.append(time.perf_counter() - t0)
        return statistics.median(times[WARMUP:])

    return _threaded_gloo(ranks, body) * 1e3


def profile_job(
    model: ModelConfig, pipelines: int, stages: int, microbatches: int, data: DataConfig | None = None,
    reps: int = 10, device: str = "cpu",
) -> dict[str, Any]:
    """Measure every stage and return a contract job spec (validated by the planner's parser)."""
    data = data or DataConfig()
    if reps < 1:
        raise ConfigError(f"reps: must be >= 1, got {reps}", "reps")
    model.stage_layers(stages)
    dev = torch_device(device)
    rows = []
    for s in range(stages):
        module = StageModule(model, stages, s).to(dev)
        row = profile_stage(module, model, data.batch_size, reps, dev)
        row["allreduce"] = allreduce_ms(sum(p.numel() for p in module.parameters()), pipelines, reps)
        rows.append(row)
    hop = p2p_ms(data.batch_size * model.seq_len * model.width, reps)
    return job_spec_from_rows(rows, pipelines, stages, microbatches, hop)


def job_spec_from_rows(rows: list[dict], pipelines: int, stages: int, microbatches: int,
                       hop_ms: float) -> dict[str, Any]:
    """Per-stage measurements (F, B, W, optimizer, allreduce ms; activation_mb) as a contract job
    spec, checked by the planner's parser (it must accept what we write)."""

    def per_stage(key: str) -> list[float]:
        return [round(max(r[key], 1e-4), 4) for r in rows]

    spec = {
        "pipelines": pipelines, "stages": stages, "microbatches": microbatches,
        "forward_ms": per_stage("F"), "backward_input_ms": per_stage("B"),
        "backward_weight_ms": per_stage("W"), "p2p_ms": round(hop_ms, 4),
        "cross_pipeline_p2p_ms": round(hop_ms, 4),
        "allreduce_ms": [round(r["allreduce"], 4) for r in rows],
        "optimizer_ms": per_stage("optimizer"),
        "activation_mb": [round(r["activation_mb"], 4) for r in rows],
        "memory_limit_mb": None,
    }
    if all("activation_w_mb" in r for r in rows):
        spec["activation_w_mb"] = [round(r["activation_w_mb"], 4) for r in rows]
    JobSpec.parse(spec)
    return spec
