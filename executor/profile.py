"""`recycle profile`: measure a model on this machine and write the planner's job spec.

The built-in model is profiled as the training app it is (`executor/app_profile.py`: F, B and W
through the workers' own runner, the optimizer step, activation memory after F and after B).
Communication, here for every app: on loopback gloo,
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

from executor.data import DataConfig, builtin_app
from executor.model import ConfigError, ModelConfig
from planner.spec import JobSpec

WARMUP = 2


def stage_input(app, stage: int, stages: int, pipelines: int, microbatches: int, device: torch.device):
    """(input, target) of micro-batch 0 at `stage`: its data run through the stages before it."""
    from executor.app import as_tuple, build_stage, call_stage
    from executor.app_stage import to_device

    x, target = app.microbatch(0, 0, pipelines * microbatches)
    value = to_device(x, device)
    for s in range(stage):
        module = build_stage(app, s, stages).to(device)
        with torch.no_grad():
            value = module(value) if s == 0 else call_stage(module, tuple(as_tuple(value)))
    if stage:
        value = tuple(t.detach() for t in as_tuple(value))
    return value, to_device(target, device) if stage == stages - 1 else None


def profile_stage(model: ModelConfig, data: DataConfig, stage: int, stages: int, reps: int,
                  device: torch.device) -> dict:
    """F, B, W, optimizer (ms) and activation memory (MB) of one stage of the built-in model, through
    the workers' own `AppStageRunner`."""
    from executor.app import build_stage
    from executor.app_profile import profile_app_stage

    app = builtin_app(model, data)
    x, target = stage_input(app, stage, stages, 1, 1, device)
    module = build_stage(app, stage, stages).to(device)
    return profile_app_stage(app, module, stage, stages, x, target, reps, device)


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
    """Measure every stage of the built-in model and return a contract job spec (validated by the
    planner's parser): `recycle profile --app`'s measurement on the built-in app."""
    from executor.app_profile import profile_app

    if reps < 1:
        raise ConfigError(f"reps: must be >= 1, got {reps}", "reps")
    model.stage_layers(stages)
    app = builtin_app(model, data or DataConfig())
    return profile_app(app, pipelines, stages, microbatches, reps, device)


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
