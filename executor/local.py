"""A local cluster in one call: plan, start D x S worker processes, train, collect the results.

Used by the tests and the benchmarks. The launcher process hosts the c10d `TCPStore` (it outlives
the workers), plans the failure set with `planner.solve.plan`, turns the plan into one
`InstructionStream` per alive worker, and starts each worker as its own Python process
(`python -m executor.process`: a real OS process that can be killed like a real worker). A worker
in the failure set is simply never started: its micro-batches run on its stage peers as the plan
re-routes them. Every wait is bounded: a worker that does not finish by the deadline is killed and
the run fails with a message naming it.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch
import torch.distributed as dist

from executor.data import DataConfig
from executor.model import ConfigError, ModelConfig
from executor.optim import OptimConfig
from executor.reference import TrainingResult
from executor.worker_spec import WorkerSpec
from planner.instructions import instruction_stream
from planner.simulator import replay
from planner.solve import plan
from planner.spec import JobSpec
from planner.timeline import Op
from planner.validate import validate


class LocalRunError(RuntimeError):
    """A local training run that did not complete; the message names the worker and the cause."""


@dataclass
class LocalRun(TrainingResult):
    failed: list[tuple[int, int]] = field(default_factory=list)
    iteration_ms: list[float] = field(default_factory=list)
    """Measured: distance between the last worker's ends of consecutive iterations (first: from start)."""
    predicted_ms: float = 0.0
    """The planner's steady-state period for this failure set (in the job spec's time unit)."""
    op_seconds: dict[str, dict[str, float]] = field(default_factory=dict)
    """Per worker ("p:s"), total seconds spent in each instruction kind over all iterations."""


def uniform_job(pipelines: int, stages: int, microbatches: int) -> JobSpec:
    """A job spec with unit costs: enough to plan the order of work when no profile is given."""
    return JobSpec.parse({
        "pipelines": pipelines, "stages": stages, "microbatches": microbatches,
        "forward_ms": 1.0, "backward_input_ms": 1.0, "backward_weight_ms": 1.0, "p2p_ms": 0.05,
        "allreduce_ms": 1.0, "optimizer_ms": 0.5, "activation_mb": 1.0,
    })


def train_local(
    pipelines: int, stages: int, microbatches: int, iterations: int, model: ModelConfig,
    data: DataConfig | None = None, optim: OptimConfig | None = None,
    failed: tuple[tuple[int, int], ...] = (), job: JobSpec | None = None, device: str = "cpu",
    threads: int = 1, timeout_s: float = 300.0, operation_timeout_s: float = 60.0,
    plan_ops: Sequence[Op] | None = None, gradient_group: bool | None = None,
) -> LocalRun:
    """Train with `failed` dead from the start on the planner's plan, or on `plan_ops`: a valid
    plan of the same job and failure set (tests: orders the planner would not choose)."""
    data, optim = data or DataConfig(), optim or OptimConfig()
    if iterations < 1:
        raise ConfigError(f"iterations: must be >= 1, got {iterations}", "iterations")
    model.stage_layers(stages)  # refuses more stages than layers before anything starts
    job = job or uniform_job(pipelines, stages, microbatches)
    if (job.pipelines, job.stages, job.microbatches) != (pipelines, stages, microbatches):
        raise ConfigError("job: its pipelines/stages/microbatches differ from the run's", "job")
    result = plan(job, failed=tuple(tuple(w) for w in failed), use_cp=False)
    if plan_ops is not None:
        problems = validate(job, result.failed, plan_ops)
        if problems:
            raise ConfigError(f"plan_ops: not a valid plan of this failure set: {problems[0]}", "plan_ops")
        result = replace(result, ops=list(plan_ops), iteration_ms=replay(job, plan_ops).iteration_ms)
    dead = {tuple(w) for w in result.failed}
    alive = [(p, s) for p in range(pipelines) for s in range(stages) if (p, s) not in dead]
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=timeout_s))
    with tempfile.TemporaryDirectory(prefix="recycle-local-") as tmp:
        procs: dict[tuple[int, int], tuple[subprocess.Popen, Path]] = {}
        try:
            for w in alive:
                spec = WorkerSpec(
                    worker=w, pipelines=pipelines, stages=stages, microbatches=microbatches,
                    iterations=iterations, generation=0, alive=alive,
                    stream=instruction_stream(job, result.failed, result.ops, w).model_dump(mode="json"),
                    model=model.to_json(), data=data.__dict__, optim=optim.to_json(),
                    store_port=store.port, device=device, threads=threads, gradient_group=gradient_group,
                    operation_timeout_s=operation_timeout_s,
                    group_setup_timeout_s=max(2 * operation_timeout_s, 30.0),
                )
                spec_path = Path(tmp) / f"worker-{w[0]}-{w[1]}.json"
                spec_path.write_text(spec.to_json())
                path = Path(tmp) / f"worker-{w[0]}-{w[1]}.pt"
                procs[w] = (_start_worker(spec_path, path, Path(tmp) / f"worker-{w[0]}-{w[1]}.log"), path)
            deadline = time.monotonic() + timeout_s
            for w, (proc, _) in procs.items():
                try:
                    proc.wait(max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    raise LocalRunError(f"worker {list(w)} did not finish within {timeout_s:.0f} s") from None
            outputs = {}
            for w, (proc, path) in procs.items():
                if not path.exists():
                    log = (Path(tmp) / f"worker-{w[0]}-{w[1]}.log").read_text()[-2000:]
                    raise LocalRunError(
                        f"worker {list(w)} exited with code {proc.returncode} and no result:\n{log}"
                    )
                out = torch.load(path, weights_only=False)
                if out["error"]:
                    raise LocalRunError(f"worker {list(w)} failed: {out['error']}\n{out['traceback']}")
                outputs[w] = out
        finally:
            for proc, _ in procs.values():
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(5)
    return _collect(outputs, stages, sorted(dead), result.iteration_ms)


def _start_worker(spec_path: Path, result_path: Path, log_path: Path) -> subprocess.Popen:
    repo_root = str(Path(__file__).resolve().parent.parent)
    path = os.pathsep.join(filter(None, [repo_root, os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "PYTHONPATH": path}
    with open(log_path, "wb") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "executor.process", str(spec_path), str(result_path)],
            stdout=log, stderr=subprocess.STDOUT, env=env,
        )


def _collect(outputs: dict, stages: int, failed: list, predicted_ms: float) -> LocalRun:
    last = [out for (p, s), out in sorted(outputs.items()) if s == stages - 1]
    losses = last[0]["losses"]
    stage_parameters = []
    for s in range(stages):
        replicas = [out["parameters"] for (p, q), out in sorted(outputs.items()) if q == s]
        for other in replicas[1:]:
            for name, t in replicas[0].items():
                if not torch.equal(t, other[name]):
                    raise LocalRunError(f"stage {s}: replicas disagree on {name} after training")
        stage_parameters.append(replicas[0])
    started = min(out["started_s"] for out in outputs.values())
    ends = [max(out["iteration_end_s"][i] for out in outputs.values()) for i in range(len(losses))]
    iteration_ms = [(b - a) * 1e3 for a, b in zip([started, *ends[:-1]], ends, strict=True)]
    return LocalRun(
        losses=losses, stage_parameters=stage_parameters, failed=[tuple(w) for w in failed],
        iteration_ms=iteration_ms, predicted_ms=predicted_ms,
        op_seconds={f"{p}:{s}": out["op_seconds"] for (p, s), out in outputs.items()},
    )
