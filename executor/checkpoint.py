"""Checkpoints of a training run with `torch.distributed.checkpoint` (DCP), keys per contracts.md.

`DIR/step-{k}` (k = iterations completed) is one DCP checkpoint holding, for every stage s and every
entry `name` of that stage module's `state_dict()`, the key `stages.{s}.{name}`; each stage's
optimizer state under `optimizers.{s}` (its `state_dict`, serialized: any optimizer) and the step
under `step`.

How the stages' parts become one checkpoint without a shared process group: one replica per stage
(the lowest alive one) snapshots its stage after iteration k's optimizer step (a copy, so training
goes on at once) and a background thread writes it as `DIR/.step-{k}.parts/stage-{s}.pt` (written
to a temporary name, then renamed). Stage 0's writer then assembles the S parts in its background
thread: `dcp.save` into `DIR/.step-{k}.tmp`, renamed to `DIR/step-{k}` only when complete. So the
newest `step-*` directory is never half-written, and a crash at any point leaves only hidden
leftovers that `latest_complete` ignores. The directory must be shared by the writers (the usual
checkpoint file system); DCP reads it back in one process without a process group.
"""

from __future__ import annotations

import io
import os
import re
import shutil
import threading
import time
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

STEP = re.compile(r"^step-(\d+)$")


def stage_keys(stage: int, module_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return {f"stages.{stage}.{name}": t for name, t in module_state.items()}


def latest_complete(directory: str | Path) -> tuple[int, Path] | None:
    """The newest `step-k` that holds a finished DCP checkpoint (its `.metadata` written)."""
    root = Path(directory)
    if not root.is_dir():
        return None
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := STEP.match(p.name)) and (p / ".metadata").is_file()]
    return max(found) if found else None


def _write_atomic(obj: Any, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    torch.save(obj, tmp)
    tmp.replace(path)


class CheckpointWriter:
    """One stage replica's side of checkpointing (only the stage's writer calls `save`)."""

    def __init__(self, directory: str | Path, stage: int, stages: int, timeout_s: float = 600.0):
        self.root = Path(directory)
        self.stage, self.stages, self.timeout_s = stage, stages, timeout_s
        self.root.mkdir(parents=True, exist_ok=True)
        self._threads: list[threading.Thread] = []
        self._steps: set[int] = set()
        self.errors: list[str] = []

    def save(self, step: int, module: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Snapshot now (on CPU), write in the background. A step this replica already wrote is
        skipped: after a rollback the rerun reaches the same state (training is exact)."""
        if step in self._steps or (self.root / f"step-{step}").is_dir():
            return
        self._steps.add(step)
        module_state = {k: v.detach().to("cpu", copy=True) for k, v in module.state_dict().items()}
        buf = io.BytesIO()
        torch.save(optimizer.state_dict(), buf)
        part = {"module": module_state, "optimizer": buf.getvalue()}
        thread = threading.Thread(target=self._write, args=(step, part), daemon=True,
                                  name=f"checkpoint-{step}")
        thread.start()
        self._threads.append(thread)

    def _write(self, step: int, part: dict[str, Any]) -> None:
        try:
            parts = self.root / f".step-{step}.parts"
            parts.mkdir(exist_ok=True)
            _write_atomic(part, parts / f"stage-{self.stage}.pt")
            if self.stage == 0:
                self._assemble(step, parts)
        except Exception as exc:  # a failed checkpoint must never stop training
            self.errors.append(f"step {step}: {type(exc).__name__}: {exc}")

    def _assemble(self, step: int, parts: Path) -> None:
        deadline = time.monotonic() + self.timeout_s
        files = [parts / f"stage-{s}.pt" for s in range(self.stages)]
        while not all(f.is_file() for f in files):
            if (self.root / f"step-{step}" / ".metadata").is_file():
                return  # assembled already
            if time.monotonic() > deadline:
                raise TimeoutError(f"stage parts of step {step} missing after {self.timeout_s:.0f} s")
            time.sleep(0.05)
        state: dict[str, Any] = {"step": torch.tensor(step)}
        for s, f in enumerate(files):
            part = torch.load(f, weights_only=True)
            state.update(stage_keys(s, part["module"]))
            state[f"optimizers.{s}"] = io.BytesIO(part["optimizer"])
        tmp, final = self.root / f".step-{step}.tmp", self.root / f"step-{step}"
        shutil.rmtree(tmp, ignore_errors=True)
        dcp.save(state, checkpoint_id=str(tmp), no_dist=True)
        tmp.replace(final)
        shutil.rmtree(parts, ignore_errors=True)

    def flush(self, timeout_s: float | None = None) -> None:
        """Wait for this replica's writes (bounded) before the process exits."""
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))


def load_stage(path: str | Path, stage: int, module: torch.nn.Module,
               optimizer: torch.optim.Optimizer | None = None) -> int:
    """Restore one stage (parameters, buffers, optimizer state) from a checkpoint; returns its step."""
    state: dict[str, Any] = {k: v.detach().clone() for k, v in stage_keys(stage, module.state_dict()).items()}
    state["step"] = torch.tensor(0)
    if optimizer is not None:
        state[f"optimizers.{stage}"] = io.BytesIO()
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    prefix = f"stages.{stage}."
    module.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
    if optimizer is not None:
        blob = state[f"optimizers.{stage}"]
        blob.seek(0)
        optimizer.load_state_dict(torch.load(blob, weights_only=True))
    return int(state["step"])


def load_parameters(path: str | Path, template: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Read the given `stages.{s}.{name}` keys (shaped like `template`) in one process."""
    state = {k: torch.empty_like(v) for k, v in template.items()}
    dcp.load(state, checkpoint_id=str(path), no_dist=True)
    return state
