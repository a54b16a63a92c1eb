"""Distributed training with re-routed micro-batches is the same math as one process.

Each case starts real worker processes (gloo on CPU, isend/irecv matched by order per peer,
per-stage all-reduce) on the planner's instruction streams. Failed workers are absent from the
start (a static failure set): their micro-batches run on same-stage peers, crossing pipelines,
and the losses and final parameters must equal a plain single-process training on the same
global batches.
"""

from __future__ import annotations

import pytest

from executor.local import train_local
from planner.spec import SpecError
from tests.executor.references import reference, tiny

pytestmark = pytest.mark.slow

ITERATIONS = 8
MICROBATCHES = 4
RTOL = 1e-5


@pytest.fixture(scope="module")
def references():
    return lambda pipelines, stages: reference(pipelines, stages, MICROBATCHES, ITERATIONS)


def assert_same_training(run, ref):
    assert len(run.losses) == len(ref.losses) == ITERATIONS
    for it, (a, b) in enumerate(zip(run.losses, ref.losses, strict=True)):
        assert abs(a - b) <= RTOL * abs(b), f"iteration {it}: loss {a} vs reference {b}"
    for s, (got, want) in enumerate(zip(run.stage_parameters, ref.stage_parameters, strict=True)):
        assert got.keys() == want.keys()
        for name, t in want.items():
            rel = float((got[name] - t).norm() / t.norm())
            assert rel <= RTOL, f"stage {s} {name}: relative difference {rel}"
    # Training moved the parameters (the comparison is not between two untouched models).
    assert ref.losses[-1] < ref.losses[0]


CASES = [
    (3, 2, ()),
    (3, 2, ((1, 1),)),
    (3, 2, ((1, 1), (2, 0))),
    (2, 3, ()),
    (2, 3, ((0, 1),)),
    (2, 3, ((0, 1), (1, 2))),
]


@pytest.mark.parametrize(("pipelines", "stages", "failed"), CASES, ids=lambda v: str(v).replace(" ", ""))
def test_training_equals_single_process(references, pipelines, stages, failed):
    run = train_local(pipelines, stages, MICROBATCHES, ITERATIONS, tiny(stages), failed=failed,
                      timeout_s=240, operation_timeout_s=60)
    assert run.failed == sorted(failed)
    assert_same_training(run, references(pipelines, stages))


def test_a_stage_with_no_survivor_is_refused_before_anything_starts():
    with pytest.raises(SpecError, match="stage 1"):
        train_local(2, 2, 2, 1, tiny(2), failed=((0, 1), (1, 1)))


def _out_of_send_order(job, failed, ops) -> int:
    """Receives that come in another order than their sender sends them (from the two ends'
    streams): what NCCL, which matches a pair's messages by order, would pair wrongly."""
    from tests.planner.random_plans import channel_orders

    sent, received = channel_orders(job, failed, ops)
    return sum(mb != ins.microbatch for k in sent for mb, ins in zip(sent[k], received[k], strict=True))


@pytest.mark.parametrize("gradient_group", [False, True], ids=["one-p2p-group", "gradients-apart"])
def test_a_plan_that_receives_out_of_send_order_trains_exactly(references, gradient_group):
    """Workers match a pair's messages by order (as NCCL does, tags ignored) and post receives in
    the sender's order. A random valid plan whose workers consume micro-batches in another order
    than their peers produce them must still train exactly, with gradients in the activations'
    P2P group (gloo's way) or in one of their own (the GPU's way, run here with gloo)."""
    import random

    from executor.local import uniform_job
    from tests.planner.random_plans import random_plan

    failed = ((1, 1),)
    job = uniform_job(2, 2, MICROBATCHES)
    plans = (random_plan(job, list(failed), random.Random(seed), stay_home=0.3) for seed in range(40))
    ops = next(p for p in plans if p is not None and _out_of_send_order(job, failed, p) >= 2)
    run = train_local(2, 2, MICROBATCHES, ITERATIONS, tiny(2), failed=failed, job=job, plan_ops=ops,
                      timeout_s=240, operation_timeout_s=60, gradient_group=gradient_group)
    assert_same_training(run, references(2, 2))
