"""Each of the contract's six validity rules, broken one at a time on a valid plan.

The plan is a sweep schedule of a 3 x 3 x 4 job with worker [0, 1] failed and only its micro-batches
re-routed, so it has cross-pipeline hops (p2p 0.5 ms, cross-pipeline 2.0 ms).
"""

from __future__ import annotations

import pytest

from planner.validate import validate

FAILED = [(0, 1)]


def find(ops, kind, worker=None, mb=None, stage=None):
    for op in ops:
        if op.kind == kind and (worker is None or op.worker == worker) \
                and (mb is None or op.microbatch == mb) and (stage is None or op.worker[1] == stage):
            return op
    raise LookupError(f"no {kind} op on {worker} for {mb}")


def shift(op, delta):
    op.start_ms += delta
    op.end_ms += delta


def rules(violations) -> set[str]:
    return {v.split(":", 1)[0] for v in violations}


@pytest.fixture
def ops(rerouted_ops, copy_ops):
    return copy_ops(rerouted_ops)


def test_the_unbroken_plan_is_valid(small_job, ops):
    assert validate(small_job, FAILED, ops) == []


# ----------------------------------------------------------------------------------- rule 1: coverage


def test_missing_op_is_reported(small_job, ops):
    ops.remove(find(ops, "F", mb=(1, 2), stage=2))
    assert "rule 1: microbatch [1, 2] stage 2 lacks ['F']" in validate(small_job, FAILED, ops)


def test_duplicate_op_is_reported(small_job, ops, copy_ops):
    ops.append(copy_ops([find(ops, "B", mb=(2, 0), stage=0)])[0])
    assert "rule 1: two B ops for microbatch [2, 0] at stage 0" in validate(small_job, FAILED, ops)


def test_op_on_failed_worker_is_reported(small_job, ops):
    for kind in ("F", "B", "W"):
        find(ops, kind, mb=(0, 1), stage=1).worker = (0, 1)
    found = validate(small_job, FAILED, ops)
    assert any(v.startswith("rule 1: F runs on failed worker [0, 1]") for v in found), found


def test_micro_batch_of_alive_worker_may_move_to_any_same_stage_peer(small_job, ops):
    # Rule 1 lets any alive peer of the stage serve any micro-batch: moving [1, 0]'s stage-2 work to
    # worker [2, 2] breaks no coverage rule (only timing rules, which this move may also break).
    for kind in ("F", "B", "W"):
        find(ops, kind, mb=(1, 0), stage=2).worker = (2, 2)
    found = validate(small_job, FAILED, ops)
    assert not any(v.startswith("rule 1") for v in found), found


def test_f_b_w_of_one_micro_batch_must_share_a_worker(small_job, ops):
    find(ops, "W", mb=(1, 0), stage=2).worker = (2, 2)
    found = validate(small_job, FAILED, ops)
    assert any(v.startswith("rule 1: microbatch [1, 0] stage 2 split over") for v in found), found


def test_op_on_unknown_worker_is_reported(small_job, ops):
    find(ops, "OPTIMIZER", worker=(1, 1)).worker = (7, 1)
    assert "rule 1: op on unknown worker [7, 1]" in validate(small_job, FAILED, ops)


# ---------------------------------------------------------------------------------- rule 2: durations


@pytest.mark.parametrize("kind", ["F", "B", "W", "ALLREDUCE", "OPTIMIZER"])
def test_wrong_duration_is_reported(small_job, ops, kind):
    op = find(ops, kind, worker=(2, 2))
    op.end_ms -= 0.1  # shorter: breaks rule 2 and nothing else
    found = validate(small_job, FAILED, ops)
    assert rules(found) == {"rule 2"}, found
    assert found[0].startswith(f"rule 2: {kind} on [2, 2] lasts")


# ------------------------------------------------------------------------------------- rule 3: order


def test_forward_before_same_pipeline_input_arrives(small_job, ops):
    prev = find(ops, "F", mb=(1, 3), stage=0)
    op = find(ops, "F", mb=(1, 3), stage=1)
    shift(op, prev.end_ms + 0.25 - op.start_ms)  # the same-pipeline hop is 0.5 ms
    found = validate(small_job, FAILED, ops)
    assert "rule 3: F of [1, 3] at stage 1 starts before its input arrives" in found


def test_forward_before_cross_pipeline_input_arrives(small_job, ops):
    # Micro-batch [0, m] ran stage 1 on a peer pipeline and comes home for stage 2: a cross hop (2 ms).
    rerouted = next(op for op in ops if op.kind == "F" and op.microbatch[0] == 0 and op.worker[1] == 1)
    home = find(ops, "F", mb=rerouted.microbatch, stage=2)
    assert home.worker == (0, 2)
    shift(home, rerouted.end_ms + 1.0 - home.start_ms)  # enough for a same-pipeline hop, not a cross one
    hp, m = rerouted.microbatch
    assert f"rule 3: F of [{hp}, {m}] at stage 2 starts before its input arrives" in \
        validate(small_job, FAILED, ops)


def test_backward_before_gradient_arrives(small_job, ops):
    nxt = find(ops, "B", mb=(2, 1), stage=2)
    op = find(ops, "B", mb=(2, 1), stage=1)
    shift(op, nxt.end_ms - op.start_ms)  # no time for the hop
    assert "rule 3: B of [2, 1] at stage 1 starts before its gradient arrives" in \
        validate(small_job, FAILED, ops)


def test_last_stage_backward_before_its_forward_ends(small_job, ops):
    f = find(ops, "F", mb=(2, 2), stage=2)
    b = find(ops, "B", mb=(2, 2), stage=2)
    shift(b, f.end_ms - 0.5 - b.start_ms)
    found = validate(small_job, FAILED, ops)
    assert "rule 3: B of [2, 2] on the last stage starts before its F ends" in found


def test_weight_gradient_before_its_backward_ends(small_job, ops):
    b = find(ops, "B", mb=(1, 1), stage=0)
    w = find(ops, "W", mb=(1, 1), stage=0)
    shift(w, b.end_ms - 0.5 - w.start_ms)
    assert "rule 3: W of [1, 1] at stage 0 starts before its B ends" in validate(small_job, FAILED, ops)


# ----------------------------------------------------------------------------------- rule 4: overlap


def test_two_ops_at_once_on_a_worker(small_job, ops):
    worker_ops = sorted((op for op in ops if op.worker == (2, 0) and op.kind == "F"),
                        key=lambda o: o.start_ms)
    first, second = worker_ops[0], worker_ops[1]
    shift(second, first.start_ms + 0.5 - second.start_ms)
    found = validate(small_job, FAILED, ops)
    assert any(v.startswith("rule 4:") and "overlap on [2, 0]" in v for v in found), found


# ----------------------------------------------------------------------------- rule 5: collectives


def test_allreduce_starts_must_agree(small_job, ops):
    shift(find(ops, "ALLREDUCE", worker=(1, 2)), 1.0)
    shift(find(ops, "OPTIMIZER", worker=(1, 2)), 1.0)
    found = validate(small_job, FAILED, ops)
    assert any(v.startswith("rule 5: ALLREDUCE starts of stage 2 differ") for v in found), found


def test_allreduce_waits_for_every_weight_gradient_of_its_stage(small_job, ops):
    last_w = max(op.end_ms for op in ops if op.kind == "W" and op.worker[1] == 0)
    for p in range(3):  # all start together, 1 ms before the stage's last W ends
        ar, opt = find(ops, "ALLREDUCE", worker=(p, 0)), find(ops, "OPTIMIZER", worker=(p, 0))
        shift(ar, last_w - 1.0 - ar.start_ms)
        shift(opt, ar.end_ms - opt.start_ms)
    found = validate(small_job, FAILED, ops)
    assert "rule 5: ALLREDUCE on [1, 0] starts before every W of stage 0 ends" in found


def test_optimizer_follows_its_allreduce(small_job, ops):
    shift(find(ops, "OPTIMIZER", worker=(2, 1)), -0.5)
    assert "rule 5: OPTIMIZER on [2, 1] starts before its ALLREDUCE ends" in validate(small_job, FAILED, ops)


def test_every_alive_worker_has_one_allreduce(small_job, ops):
    ops.remove(find(ops, "ALLREDUCE", worker=(1, 1)))
    assert "rule 5: worker [1, 1] has 0 ALLREDUCE and 1 OPTIMIZER ops" in validate(small_job, FAILED, ops)


# ------------------------------------------------------------------------------------ rule 6: memory


def test_memory_limit(make_job, failed_plan):
    # The plan was made for the default limit (3 micro-batches); hold it to one micro-batch.
    tight = make_job(memory_limit_mb=1.0)
    found = validate(tight, FAILED, failed_plan.ops)
    assert found and rules(found) == {"rule 6"}, found
    assert "memory_limit_mb 1" in found[0]


def _one_worker_ops(order):
    """(kind, index) ops back to back from t=0 on the single worker of a 1 x 1 job, 1 ms each."""
    from planner.timeline import Op

    ops, t = [], 0.0
    for kind, m in order:
        ops.append(Op((0, 0), kind, (0, m), t, t + 1.0))
        t += 1.0
    ops.append(Op((0, 0), "ALLREDUCE", None, t, t + 1.0))
    ops.append(Op((0, 0), "OPTIMIZER", None, t + 1.0, t + 2.0))
    return ops


def test_memory_after_b_counts_only_activation_w_mb():
    # F0 B0 F1 F2 B1 B2 W0 W1 W2 with activation 1 MB and 0.5 MB from B end to W end: just after F2
    # starts the worker holds 0.5 (micro-batch 0, between B and W) + 1 + 1 = 2.5 MB (worked by hand).
    from planner.spec import JobSpec
    from planner.validate import peak_memory

    order = [("F", 0), ("B", 0), ("F", 1), ("F", 2), ("B", 1), ("B", 2), ("W", 0), ("W", 1), ("W", 2)]
    base = dict(pipelines=1, stages=1, microbatches=3, forward_ms=1.0, backward_input_ms=1.0,
                backward_weight_ms=1.0, p2p_ms=0.0, allreduce_ms=1.0, optimizer_ms=1.0, activation_mb=1.0)
    split = JobSpec.parse({**base, "activation_w_mb": 0.5, "memory_limit_mb": 2.5})
    whole = JobSpec.parse({**base, "memory_limit_mb": 2.5})
    ops = _one_worker_ops(order)
    assert peak_memory(split, ops) == {(0, 0): 2.5}
    assert peak_memory(whole, ops) == {(0, 0): 3.0}
    assert validate(split, [], ops) == []
    assert rules(validate(whole, [], ops)) == {"rule 6"}
