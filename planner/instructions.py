"""Per-worker instruction streams: what an executor runs, with every peer spelled out.

An executor should not re-derive anything from the timeline: each compute op comes with the
receive that feeds it (right before) and the send that forwards its output (right after), naming
the peer worker and the micro-batch, and each ALLREDUCE names the group of alive stage peers.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from enum import StrEnum

from pydantic import BaseModel, Field

from planner.compress import ExpandedOps
from planner.precedence import fed_by, needs
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
    seq: int | None = Field(
        default=None, description="RECV: this message's place (from 0) among those the peer sends "
        "this worker of this tensor kind in the iteration, in the peer's order. A transport that "
        "matches messages in the order they were sent, not by tag (NCCL), must post receives in "
        "this order; the stream's own order is when each is needed.")


class InstructionStream(BaseModel):
    """Everything one worker does in one iteration, in order."""

    worker: tuple[int, int]
    stage_peers: list[tuple[int, int]] = Field(description="Alive workers of this worker's stage.")
    instructions: list[Instruction]


def instruction_stream(
    job: JobSpec, failed: tuple[Worker, ...], ops: list[Op], worker: Worker
) -> InstructionStream:
    """The instruction stream of `worker` for the plan `ops` (which must be valid)."""
    return InstructionStream.model_validate_json(instruction_stream_json(job, failed, ops, worker))


def stage_transfers(job: JobSpec) -> tuple[dict, dict]:
    """Which op feeds which across a stage boundary, from the one precedence graph
    (planner/precedence.py): (receives, sends) by (kind, stage). A job's, not a worker's: a
    service building 4,095 streams at once passes it to each (`transfers`); rebuilt per stream it
    was half of a stream's time (0.78 ms per worker at 64 x 64 x 8)."""
    rule3 = needs(job.costs, job.stages)
    recv = {k: n for k, n in rule3.items() if n.hop}
    send = {k: [n for n in feeds if n.hop] for k, feeds in fed_by(rule3).items()}
    return recv, send


def instruction_stream_json(job: JobSpec, failed: tuple[Worker, ...], ops: Sequence[Op],
                            worker: Worker, transfers: tuple[dict, dict] | None = None) -> bytes:
    """The same stream as compact JSON bytes, written directly: after a failure a service answers
    every worker of a 147k-op plan at once, and one pydantic object per instruction (or even one
    dict) is most of that time. The one builder of streams; `instruction_stream` parses its output.
    `transfers`: `stage_transfers(job)`, when the caller builds many streams of one job."""
    p, s = worker
    dead = set(map(tuple, failed))
    if worker in dead:
        raise ValueError(f"worker {list(worker)} is in the failure set and runs nothing")
    if isinstance(ops, ExpandedOps):  # a compressed plan: read from it, never expanded
        own, placement, starts = ops.expansion.worker_view(worker)
    else:
        own, placement, starts = worker_orders(ops).get(worker, []), {}, {}
        for op in ops:
            if op.microbatch is not None and op.kind in ("F", "B"):
                key = (op.kind, op.microbatch, op.worker[1])
                placement[key], starts[key] = op.worker, op.start_ms
    peers = [(q, s) for q in range(job.pipelines) if (q, s) not in dead]
    recv, send = transfers if transfers is not None else stage_transfers(job)
    seq = _send_order(own, recv, s, placement, starts)
    out: list[str] = []
    add = out.append
    for op in own:
        mb = op.microbatch
        if op.kind in ("ALLREDUCE", "OPTIMIZER"):
            add(_fragment(op.kind, group=peers if op.kind == "ALLREDUCE" else None, start=op.start_ms))
            continue
        need = recv.get((op.kind, s))
        if need is not None:
            source = (need.source, mb, need.source_stage)
            add(_fragment("RECV", mb, placement[source], _TENSOR[need.source], seq=seq[source]))
        add(_fragment(op.kind, mb, start=op.start_ms))
        for n in send.get((op.kind, s), ()):
            add(_fragment("SEND", mb, placement[(n.kind, mb, n.stage)], _TENSOR[op.kind]))
    return (f'{{"worker":[{p},{s}],"stage_peers":{_pairs(peers)},'
            f'"instructions":[{",".join(out)}]}}').encode()


_TENSOR = {"F": Tensor.ACTIVATION.value, "B": Tensor.GRADIENT.value}
"""What a stage-boundary transfer out of an op of this kind carries."""


def _send_order(own: list[Op], recv: dict, s: int, placement: dict, starts: dict) -> dict:
    """Each received message's place in its sender's order: a sender sends right after the op
    that makes the tensor, and one worker's F's (B's) start at distinct times (positive costs,
    rule 4), so the place is the rank of that op's start among the messages of one channel
    (sender, producing kind) that this worker receives."""
    channels: dict[tuple, list[tuple[float, tuple]]] = {}
    for op in own:
        need = recv.get((op.kind, s))
        if need is not None:
            source = (need.source, op.microbatch, need.source_stage)
            channels.setdefault((placement[source], need.source), []).append((starts[source], source))
    return {source: i for messages in channels.values() for i, (_, source) in enumerate(sorted(messages))}


def _pairs(ws) -> str:
    return "[" + ",".join(f"[{w[0]},{w[1]}]" for w in ws) + "]"


def _fragment(op: str, microbatch=None, peer=None, tensor=None, group=None, start=None, seq=None) -> str:
    """One `Instruction` as JSON text, every field in the model's order."""
    mb = "null" if microbatch is None else f"[{microbatch[0]},{microbatch[1]}]"
    pr = "null" if peer is None else f"[{peer[0]},{peer[1]}]"
    tn = "null" if tensor is None else f'"{tensor}"'
    gr = "null" if group is None else _pairs(group)
    st = "null" if start is None else json.dumps(start)
    sq = "null" if seq is None else str(seq)
    return (f'{{"op":"{op}","microbatch":{mb},"peer":{pr},"tensor":{tn},"group":{gr},'
            f'"planned_start_ms":{st},"seq":{sq}}}')
