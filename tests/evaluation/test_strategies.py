"""Each strategy's model on tiny jobs against numbers derived by hand.

The jobs are chosen so the planner's period is known in closed form: with one stage there are no
bubbles, so one pipeline of m micro-batches takes m (F + B + W) + all-reduce + optimizer.
"""

from __future__ import annotations

import pytest

from evaluation.strategies import Evaluator, _repartition, job_variant
from planner.spec import JobSpec

ONE_STAGE = {
    "pipelines": 4, "stages": 1, "microbatches": 3, "forward_ms": 1.0, "backward_input_ms": 2.0,
    "backward_weight_ms": 3.0, "p2p_ms": 0.0, "allreduce_ms": 5.0, "optimizer_ms": 1.0,
    "activation_mb": 1.0,
}


def one_stage(**changes) -> Evaluator:
    return Evaluator(JobSpec.parse({**ONE_STAGE, **changes}))


def test_one_stage_fault_free_is_work_plus_collectives():
    # 3 micro-batches x (1 + 2 + 3) + 5 + 1
    assert one_stage().fault_free_ms() == pytest.approx(24.0)


def test_drop_gives_the_global_batch_to_the_survivors():
    # 4 x 3 = 12 micro-batches on 3 pipelines -> 4 each: 4 x 6 + 6 = 30 ms
    out = one_stage().outcome("drop", ((1, 0),))
    assert out.iteration_ms == pytest.approx(30.0)
    assert out.throughput(one_stage().job) == pytest.approx(12 / 0.030)


def test_drop_rounds_up_to_the_busiest_pipeline():
    # 12 micro-batches on 2 pipelines -> 6 each: 36 + 6 = 42; on a 5-pipeline job with 2 lost:
    # 15 micro-batches on 3 pipelines -> 5 each = 36
    assert one_stage().outcome("drop", ((0, 0), (3, 0))).iteration_ms == pytest.approx(42.0)
    ev = one_stage(pipelines=5)
    assert ev.outcome("drop", ((0, 0), (1, 0))).iteration_ms == pytest.approx(36.0)
    ev = one_stage(pipelines=7)  # 21 micro-batches on 5 pipelines -> ceil = 5 -> 36
    assert ev.outcome("drop", ((0, 0), (1, 0))).iteration_ms == pytest.approx(36.0)


def test_adaptive_on_one_stage_spreads_the_failed_workers_micro_batches():
    # 12 micro-batches over 3 alive peers -> 4 each, all in the same stage: 4 x 6 + 6 = 30
    assert one_stage().outcome("adaptive", ((2, 0),)).iteration_ms == pytest.approx(30.0)


def test_checkpoint_runs_fault_free_after_the_restart():
    assert one_stage().outcome("checkpoint", ((2, 0),)).iteration_ms == pytest.approx(24.0)


def test_every_strategy_reports_none_when_it_cannot_train():
    ev = Evaluator(JobSpec.parse({**ONE_STAGE, "pipelines": 2, "stages": 2}))
    both = ((0, 0), (1, 1))  # every pipeline damaged
    assert ev.outcome("drop", both).iteration_ms is None
    assert ev.outcome("drop", both).throughput(ev.job) == 0.0
    whole_stage = ((0, 0), (1, 0))
    assert ev.outcome("adaptive", whole_stage).iteration_ms is None


def test_repartition_spreads_layers_evenly_and_keeps_totals():
    costs = {"forward_ms": [3.0, 3.0, 3.0, 3.0], "p2p_ms": [0.5, 1.0, 0.5, 0.5]}
    out = _repartition(costs, 3)
    assert out["forward_ms"] == pytest.approx([4.0, 4.0, 4.0])
    assert out["p2p_ms"] == [1.0, 1.0, 1.0]
    uneven = _repartition({"forward_ms": [1.0, 2.0, 3.0, 6.0]}, 2)["forward_ms"]
    assert uneven == pytest.approx([3.0, 9.0])


def test_oobleck_balances_micro_batches_by_pipeline_speed():
    # 2 pipelines of 2 stages, one loses a worker: it becomes a 1-stage pipeline doing both stages'
    # work (F 2, B 4, W 6 = 12 per micro-batch, all-reduce 10, optimizer 2 after re-partitioning).
    job = JobSpec.parse({**ONE_STAGE, "pipelines": 2, "stages": 2, "microbatches": 4})
    ev = Evaluator(job, oobleck_min_stages=1, baseline_schedule="planner")
    out = ev.outcome("oobleck", ((1, 1),))
    short = ev.single_pipeline_ms(_repartition(ev.base_costs(), 1), 3)
    assert short == pytest.approx(3 * 12 + 10 + 2)
    # The division minimises the slowest pipeline over every split of the 8 micro-batches.
    full, part = ev.base_costs(), _repartition(ev.base_costs(), 1)
    best = min(max(ev.single_pipeline_ms(full, a), ev.single_pipeline_ms(part, 8 - a))
               for a in range(1, 8))
    assert out.iteration_ms == pytest.approx(best)
    assert out.iteration_ms < ev.outcome("drop", ((1, 1),)).iteration_ms
    # With a 2-stage minimum the damaged pipeline is dissolved: the same as dropping it.
    strict = Evaluator(job, oobleck_min_stages=2, baseline_schedule="planner").outcome("oobleck", ((1, 1),))
    assert strict.iteration_ms == pytest.approx(ev.outcome("drop", ((1, 1),)).iteration_ms)


def test_bamboo_fault_free_overhead_is_the_successors_forward():
    # One pipeline of 2 stages, ring: each stage adds the other's forward (1 ms) to its W.
    job = JobSpec.parse({**ONE_STAGE, "pipelines": 2, "stages": 2, "microbatches": 1})
    ev = Evaluator(job, baseline_schedule="planner")
    with_redundancy = job_variant(job, backward_weight_ms=4.0, pipelines=1)
    from planner.solve import plan

    expected = plan(with_redundancy, (), use_cp=False).iteration_ms
    assert ev.outcome("bamboo", ()).iteration_ms == pytest.approx(expected)
    assert ev.outcome("bamboo", ()).iteration_ms > ev.fault_free_ms()


def test_bamboo_merges_the_failed_stage_into_its_predecessor():
    # 3 stages, stage 1 of pipeline 0 fails: its node becomes stages 0+1 (F 2, B 4, W 6), and the
    # redundant forward of the successor is added to each node's W.
    job = JobSpec.parse({**ONE_STAGE, "pipelines": 2, "stages": 3, "microbatches": 2})
    ev = Evaluator(job, baseline_schedule="planner")
    merged = {**ev.base_costs()}
    merged = {k: [sum(v[0:2]), v[2]] for k, v in merged.items()}
    for k in ("p2p_ms", "cross_pipeline_p2p_ms"):
        merged[k] = [0.0, 0.0]
    merged["backward_weight_ms"] = [6.0 + 1.0, 3.0 + 2.0]
    assert ev.outcome("bamboo", ((0, 1),)).iteration_ms == pytest.approx(
        max(ev.single_pipeline_ms(merged, 2), ev.outcome("bamboo", ()).iteration_ms))
    assert ev.outcome("bamboo", ((0, 1), (0, 2))).iteration_ms is None  # neighbours: restart
    assert ev.outcome("bamboo", ((0, 0), (0, 2))).iteration_ms is None  # ring neighbours


def test_baselines_run_an_unsplit_1f1b_by_default():
    # Zero Bubble's 6.2B profile, one pipeline of 8 stages: 1F1B with W fused after B cannot use the
    # B/W split, so it is slower than the planner's schedule; the default baseline schedule is 1F1B.
    zb = JobSpec.parse({"pipelines": 2, "stages": 8, "microbatches": 24, "forward_ms": 29.7,
                        "backward_input_ms": 29.4, "backward_weight_ms": 19.9, "p2p_ms": 0.53,
                        "allreduce_ms": 0.0, "optimizer_ms": 0.0, "activation_mb": 1.0})
    ev = Evaluator(zb)
    assert ev.baseline_schedule == "1f1b"
    costs = ev.base_costs()
    assert ev.single_pipeline_ms(costs, 24, "1f1b") > ev.single_pipeline_ms(costs, 24) + 50
    favoured = Evaluator(zb, oobleck_min_stages=1, baseline_schedule="planner")
    for failed in (((1, 3),), ((0, 1), (1, 5))):
        assert ev.outcome("oobleck", failed).iteration_ms >= favoured.outcome("oobleck", failed).iteration_ms
        assert ev.outcome("bamboo", failed).iteration_ms >= favoured.outcome("bamboo", failed).iteration_ms


def test_bamboo_slot_f_puts_the_redundant_forward_on_the_critical_path():
    job = JobSpec.parse({**ONE_STAGE, "pipelines": 2, "stages": 2, "microbatches": 4})
    assert Evaluator(job, bamboo_slot="f").outcome("bamboo", ()).iteration_ms >= \
        Evaluator(job, bamboo_slot="w").outcome("bamboo", ()).iteration_ms - 1e-9


def test_adaptive_is_cached_per_canonical_class():
    ev = Evaluator(JobSpec.parse({**ONE_STAGE, "pipelines": 3, "stages": 2}))
    a = ev.outcome("adaptive", ((0, 1),))
    b = ev.outcome("adaptive", ((2, 1),))  # the same class
    assert a.iteration_ms == b.iteration_ms and len(ev._adaptive) == 1
