"""Instruction streams: every transfer names the right peer, and the JSON fast path equals the model."""

from __future__ import annotations

import json

import pytest

from planner.instructions import InstructionStream, instruction_stream, instruction_stream_json
from planner.solve import plan
from planner.spec import JobSpec

JOB = JobSpec.parse({
    "pipelines": 3, "stages": 3, "microbatches": 4, "forward_ms": 1.0, "backward_input_ms": 1.0,
    "backward_weight_ms": 1.0, "p2p_ms": 0.1, "cross_pipeline_p2p_ms": 0.2, "allreduce_ms": 2.0,
    "optimizer_ms": 0.5, "activation_mb": 1.0,
})
FAILED = ((1, 1),)


@pytest.fixture(scope="module")
def result():
    return plan(JOB, FAILED, use_cp=False)


def alive_workers():
    return [(p, s) for p in range(JOB.pipelines) for s in range(JOB.stages) if (p, s) not in FAILED]


def test_every_transfer_names_the_worker_that_runs_the_other_end(result):
    where = {(op.kind, op.microbatch, op.worker[1]): op.worker for op in result.ops if op.microbatch}
    moved = 0
    for worker in alive_workers():
        stream = instruction_stream(JOB, result.failed, result.ops, worker)
        s = worker[1]
        for i, ins in enumerate(stream.instructions):
            if ins.op in ("RECV", "SEND"):
                compute = stream.instructions[i + 1] if ins.op == "RECV" else stream.instructions[i - 1]
                assert compute.microbatch == ins.microbatch
                # Activations flow to higher stages, gradients to lower ones.
                forward = ins.tensor == "activation"
                other_stage = s - 1 if (ins.op == "RECV") == forward else s + 1
                kind = "F" if forward else "B"
                assert ins.peer == where[(kind, ins.microbatch, other_stage)]
                moved += ins.peer[0] != worker[0]
            if ins.op == "ALLREDUCE":
                assert ins.group == [(p, s) for p in range(JOB.pipelines) if (p, s) not in FAILED]
        # Compute ops appear in the plan's order, each F/B/W exactly once per micro-batch it runs.
        computes = [(i.op, i.microbatch) for i in stream.instructions if i.op in ("F", "B", "W")]
        assert len(computes) == len(set(computes))
        assert stream.instructions[-1].op == "OPTIMIZER"
    assert moved > 0  # the failed worker's micro-batches cross pipelines


def test_every_stage_boundary_is_one_send_matched_by_one_recv(result):
    """Each micro-batch crosses S - 1 boundaries forwards (activation) and S - 1 backwards
    (gradient): 2 x D x M x (S - 1) transfers, each a SEND on one end and a RECV on the other."""
    sends, recvs = [], []
    for worker in alive_workers():
        for ins in instruction_stream(JOB, result.failed, result.ops, worker).instructions:
            if ins.op == "SEND":
                sends.append((worker, ins.peer, ins.microbatch, ins.tensor))
            elif ins.op == "RECV":
                recvs.append((ins.peer, worker, ins.microbatch, ins.tensor))
    assert len(sends) == 2 * JOB.pipelines * JOB.microbatches * (JOB.stages - 1)
    assert sorted(sends) == sorted(recvs)


def test_json_fast_path_equals_the_pydantic_model(result):
    for worker in alive_workers():
        model = instruction_stream(JOB, result.failed, result.ops, worker)
        fast = instruction_stream_json(JOB, result.failed, result.ops, worker)
        assert json.loads(fast) == json.loads(model.model_dump_json())
        assert InstructionStream.model_validate_json(fast) == model


def test_a_failed_worker_has_no_stream(result):
    with pytest.raises(ValueError, match="failure set"):
        instruction_stream(JOB, result.failed, result.ops, (1, 1))


def _check_seq(job, failed, ops) -> int:
    """Every RECV's `seq` is its message's place in the sender's own stream; returns how many
    receives come in another order than their sender's (a plan that is not FIFO per pair)."""
    from tests.planner.random_plans import channel_orders

    sent, received = channel_orders(job, failed, ops)
    out_of_order = 0
    for channel, recvs in received.items():
        for i, ins in enumerate(recvs):
            assert ins.seq == sent[channel].index(ins.microbatch), (channel, ins)
            out_of_order += ins.seq != i
    return out_of_order


def test_seq_is_each_messages_place_in_its_senders_order(result):
    """NCCL matches a pair's messages in send order, so a receiver must post in the sender's
    order, which it learns from `seq`. Derived here from the sender's own stream, on the planner's
    plan and on random valid plans, whose orders are arbitrary (some receive out of send order)."""
    import random

    from tests.planner.random_plans import random_plan

    assert _check_seq(JOB, FAILED, result.ops) >= 0
    out_of_order = 0
    for seed in range(6):
        ops = random_plan(JOB, list(FAILED), random.Random(seed), stay_home=0.3)
        if ops is not None:
            out_of_order += _check_seq(JOB, FAILED, ops)
    assert out_of_order > 0  # the random plans did exercise receives out of send order
