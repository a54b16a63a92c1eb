"""What a worker process is told: `WorkerSpec`, JSON-able so it crosses process boundaries as text."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class WorkerSpec:
    """Everything a worker process needs; JSON-able so it crosses process boundaries as text."""

    worker: tuple[int, int]
    pipelines: int
    stages: int
    microbatches: int
    iterations: int
    generation: int
    alive: list[tuple[int, int]]
    stream: dict[str, Any]
    model: dict[str, Any]
    data: dict[str, Any] = field(default_factory=dict)
    optim: dict[str, Any] = field(default_factory=dict)
    app: str | None = None
    """A training app `MODULE:ATTR` (contracts.md); None: the built-in model of `model`/`data`."""
    store_host: str = "127.0.0.1"
    """Where the c10d rendezvous store listens (the launcher's, or `recycle rendezvous`'s)."""
    store_port: int = 0
    device: str = "cpu"
    """cpu (gloo) or cuda (NCCL)."""
    gradient_group: bool | None = None
    """P2P gradients in a process group of their own, as on a GPU (docs/design.md); None: on cuda
    only. Tests set it on the CPU to run the GPU's grouping with gloo."""
    snapshot_memory: str = "host"
    """Where a GPU worker keeps its rollback snapshots (two sets of its stage's parameters and
    optimizer state): "host" (pinned memory, copied on a side stream) or "device" (GPU memory, a
    faster copy). A CPU worker's are in its memory either way."""
    local_rank: int | None = None
    """The GPU index on this node (torchrun's LOCAL_RANK); None: the worker's rank modulo the count."""
    bind_host: str | None = None
    """The address this worker's gloo connections use (its node's); None: the host name's."""
    checkpoint_dir: str | None = None
    """Write `torch.distributed.checkpoint` checkpoints here (executor.checkpoint); shared by all
    workers, it is also where a job that lost a whole stage restores from."""
    checkpoint_every: int = 0
    """... every this many iterations (0: never)."""
    resume: bool = False
    """Start from the newest complete checkpoint in `checkpoint_dir`."""
    stage_lost_wait_s: float = 600.0
    """How long to wait for a worker to rejoin a stage that lost every worker before giving up."""
    threads: int = 1
    operation_timeout_s: float = 60.0
    group_setup_timeout_s: float = 120.0
    service_url: str | None = None
    """Live mode: follow this service's membership generations (the stream above is unused)."""
    job_id: str | None = None
    service_token: str | None = None
    rejoin_at: int | None = None
    """A restarted worker: rejoin once training has completed this many iterations (at once when
    the job is waiting for a stage that lost every worker)."""
    pause_at: list[str] = field(default_factory=list)
    """Fault injection: "ITER:PHASE" points where the worker announces itself and waits to be killed."""
    hold_at: list[list[int]] = field(default_factory=list)
    """[ITER, P, S]: a restarted peer rejoins at ITER; while it is still failed, wait at that
    iteration boundary (bounded) for its generation to arrive."""
    post_progress: bool = False
    """Post each iteration's loss and end and each generation's start to the store, for a launcher
    that reports the run and must outlive its killed workers (the local cluster). Off for `recycle
    worker`: nobody reads them there, and a long run would grow the rendezvous store without bound."""

    def to_json(self) -> str:
        return json.dumps(self.__dict__)

    @classmethod
    def from_json(cls, text: str) -> WorkerSpec:
        raw = json.loads(text)
        raw["worker"] = tuple(raw["worker"])
        raw["alive"] = [tuple(w) for w in raw["alive"]]
        return cls(**raw)
