"""Per-worker instruction streams: what an executor runs, with every peer spelled out.

An executor should not re-derive anything from the timeline: each compute op comes with the
receive that feeds it (right before) and the send that forwards its output (right after), naming
the peer worker and the micro-batch, and each ALLREDUCE names the group of alive stage peers.
"""

from __future__ import annotations

from enum import StrEnum

from pydantic import BaseModel, Field

from planner.spec import JobSpec, Worker
from planner.timeline import Op, worker_orders


class InstructionKind(StrEnum):
    RECV = "RECV"
    SEND = "SEND"
    F = "F"
    B = "B"
    W = "W"
    ALLREDUCE = "ALLREDUCE"
    OPTIMIZER = "OPTIMIZER"


class Tensor(StrEnum):
    ACTIVATION = "activation"
    """Output of F at stage s, input of F at stage s+1."""
    GRADIENT = "gradient"
    """Output of B at stage s, input of B at stage s-1."""


class Instruction(BaseModel):
    op: InstructionKind
    microbatch: tuple[int, int] | None = Field(default=None, description="[home pipeline, index]")
    peer: tuple[int, int] | None = Field(default=None, description="The other end of a SEND/RECV.")
    tensor: Tensor | None = None
    group: list[tuple[int, int]] | None = Field(
        default=None, description="ALLREDUCE: the alive workers of this stage, in pipeline order."
    )
    planned_start_ms: float | None = None


class InstructionStream(BaseModel):
    """Everything one worker does in one iteration, in order."""

    worker: tuple[int, int]
    stage_peers: list[tuple[int, int]] = Field(description="Alive workers of this worker's stage.")
    instructions: list[Instruction]


def instruction_stream(
    job: JobSpec, failed: tuple[Worker, ...], ops: list[Op], worker: Worker
) -> InstructionStream:
    """The instruction stream of `worker` for the plan `ops` (which must be valid)."""
    p, s = worker
    dead = set(map(tuple, failed))
    if worker in dead:
        raise ValueError(f"worker {list(worker)} is in the failure set and runs nothing")
    placement: dict[tuple[str, tuple[int, int], int], Worker] = {}
    for op in ops:
        if op.microbatch is not None and op.kind in ("F", "B"):
            placement[(op.kind, op.microbatch, op.worker[1])] = op.worker
    peers = [(q, s) for q in range(job.pipelines) if (q, s) not in dead]
    last = job.stages - 1
    out: list[Instruction] = []
    for op in worker_orders(ops).get(worker, []):
        mb = op.microbatch
        if op.kind == "F":
            if s > 0:
                out.append(Instruction(op="RECV", microbatch=mb, peer=placement[("F", mb, s - 1)],
                                       tensor="activation"))
            out.append(Instruction(op="F", microbatch=mb, planned_start_ms=op.start_ms))
            if s < last:
                out.append(Instruction(op="SEND", microbatch=mb, peer=placement[("F", mb, s + 1)],
                                       tensor="activation"))
        elif op.kind == "B":
            if s < last:
                out.append(Instruction(op="RECV", microbatch=mb, peer=placement[("B", mb, s + 1)],
                                       tensor="gradient"))
            out.append(Instruction(op="B", microbatch=mb, planned_start_ms=op.start_ms))
            if s > 0:
                out.append(Instruction(op="SEND", microbatch=mb, peer=placement[("B", mb, s - 1)],
                                       tensor="gradient"))
        elif op.kind == "W":
            out.append(Instruction(op="W", microbatch=mb, planned_start_ms=op.start_ms))
        elif op.kind == "ALLREDUCE":
            out.append(Instruction(op="ALLREDUCE", group=peers, planned_start_ms=op.start_ms))
        else:
            out.append(Instruction(op="OPTIMIZER", planned_start_ms=op.start_ms))
    return InstructionStream(worker=worker, stage_peers=peers, instructions=out)
