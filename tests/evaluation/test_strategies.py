"""Each strategy's model on tiny jobs against numbers worked out by hand, never with the code under test.

Closed forms used (every hop delay is 0; F 1, B 2, W 3, all-reduce 5, optimizer 1 per original stage):
- One stage: no bubble, so m micro-batches take m (F + B + W) + all-reduce + optimizer.
- One micro-batch: the pipeline is a chain. Stage 0's iteration is its F, every later stage's F and B,
  its own B and W, all-reduce and optimizer, back to back (the steady-state cycle through stage 0),
  and no other stage's cycle is longer in these jobs.
- Two stages, m = 2, memory for 2 micro-batches (the default limit): stage 0 runs F0 F1, then idles
  until B0 arrives at F0 + F1 + B1 = 4 ms (2 ms idle: memory allows no third forward), then
  B0 W0 B1 W1 (the planner's B/W-split plan: 2 + 2 + 12 + 6 = 20 ms), or, in 1F1B with W fused after
  B and the last stage running F0 B0 W0 F1 B1 W1, B1 reaches stage 0 at 10 ms, one ms after W0 ends:
  2 + 2 + 5 + 1 + 5 + 6 = 21 ms. For even m >= 2 the B/W-split plan keeps that shape:
  stage 0 idles 2 ms once, so the period is 6m + 8 (20, 32, 44, 56 for m = 2, 4, 6, 8).
"""

from __future__ import annotations

import pytest

from evaluation.strategies import Evaluator, _repartition
from planner.spec import JobSpec

ONE_STAGE = {
    "pipelines": 4, "stages": 1, "microbatches": 3, "forward_ms": 1.0, "backward_input_ms": 2.0,
    "backward_weight_ms": 3.0, "p2p_ms": 0.0, "allreduce_ms": 5.0, "optimizer_ms": 1.0,
    "activation_mb": 1.0,
}


def one_stage(**changes) -> Evaluator:
    return Evaluator(JobSpec.parse({**ONE_STAGE, **changes}))


def evaluator(pipelines: int, stages: int, microbatches: int, **options) -> Evaluator:
    job = JobSpec.parse({**ONE_STAGE, "pipelines": pipelines, "stages": stages, "microbatches": microbatches})
    return Evaluator(job, **options)


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
    ev = evaluator(2, 2, 3)
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


def test_oobleck_shortens_the_damaged_pipeline_and_balances_the_batch():
    # 2 pipelines of 2 stages, 8 micro-batches; pipeline 1 loses a worker and becomes one stage doing
    # both stages' work: F 2, B 4, W 6 (12 per micro-batch), all-reduce 10, optimizer 2 -> 12 b + 12.
    # The full pipeline with a micro-batches takes 6 a + 8 (a even, module docstring). Splits a + b = 8:
    # (8, 0) 56; (7, 1) >= 50 (6a + 8 is a lower bound for odd a); (6, 2) max(44, 36) = 44;
    # (5, 3) 48; fewer on the full pipeline is worse still. Best: 44. Dropping: 8 on one = 56.
    ev = evaluator(2, 2, 4, oobleck_min_stages=1, baseline_schedule="planner")
    assert ev.outcome("oobleck", ((1, 1),)).iteration_ms == pytest.approx(44.0)
    assert ev.outcome("drop", ((1, 1),)).iteration_ms == pytest.approx(56.0)
    # With a 2-stage minimum the damaged pipeline is dissolved: the full one takes all 8.
    strict = evaluator(2, 2, 4, oobleck_min_stages=2, baseline_schedule="planner")
    assert strict.outcome("oobleck", ((1, 1),)).iteration_ms == pytest.approx(56.0)
    # Default minimum ceil(S/2) = 1 here, so the default is the first case.
    assert evaluator(2, 2, 4, baseline_schedule="planner").outcome("oobleck", ((1, 1),)).iteration_ms \
        == pytest.approx(44.0)


def test_oobleck_division_moves_micro_batches_off_the_slowest_pipeline(monkeypatch):
    # The division on its own, with invented per-pipeline periods (stages -> ms for m micro-batches):
    # 4 stages: m; 3 stages: 1.5 m; 2 stages: 2 m + 10. Pipeline 1 loses one worker, pipeline 2 two;
    # 3 x 4 = 12 micro-batches. Brute force by hand over a + b + c = 12: any c > 0 costs >= 12;
    # with c = 0, max(a, 1.5 b) is smallest at a = 7, b = 5: 7.5 ms. A split proportional to the
    # speeds at M = 4 (rates 1, 2/3, 2/9) starts at (7, 4, 1) = 12 ms, so the moves must happen.
    ev = evaluator(3, 4, 4, oobleck_min_stages=2)
    periods = {4: lambda m: m, 3: lambda m: 1.5 * m, 2: lambda m: 2 * m + 10}
    monkeypatch.setattr(ev, "single_pipeline_ms",
                        lambda costs, m, schedule="planner": periods[len(costs["forward_ms"])](m))
    out = ev.outcome("oobleck", ((1, 0), (2, 1), (2, 3)))
    assert out.iteration_ms == pytest.approx(7.5)
    assert "micro-batches 0..7" in out.detail


def test_bamboo_fault_free_overhead_is_the_successors_forward():
    # One micro-batch, 2 stages, ring: each node adds the other's forward (1 ms) to its W (slot w):
    # stage 0's chain is F0 1 + F1 1 + B1 2 + B0 2 + W0 (3 + 1) + 5 + 1 = 16, against 15 without it.
    # Slot f puts the 1 ms on both forwards instead: 2 + 2 + 2 + 2 + 3 + 5 + 1 = 17.
    for schedule in ("planner", "1f1b"):
        assert evaluator(2, 2, 1, baseline_schedule=schedule).outcome("bamboo", ()).iteration_ms \
            == pytest.approx(16.0)
        assert evaluator(2, 2, 1, baseline_schedule=schedule, bamboo_slot="f").outcome(
            "bamboo", ()).iteration_ms == pytest.approx(17.0)
    assert evaluator(2, 2, 1).fault_free_ms() == pytest.approx(15.0)


def test_bamboo_merges_the_failed_stage_into_its_predecessor():
    # 3 stages, one micro-batch. Stage 1 of pipeline 0 fails: node A runs stages 0+1 (F 2, B 4, W 6,
    # all-reduce 10, optimizer 2) plus its successor's (stage 2) forward 1 in W -> W 7; node B runs
    # stage 2 (F 1, B 2). A's chain: 2 + 1 + 2 + 4 + 7 + 10 + 2 = 28. The undamaged pipeline: each W
    # gains its successor's forward (1): 1 + 1 + 1 + 2 + 2 + 2 + 4 + 5 + 1 = 19. Slowest: 28.
    ev = evaluator(2, 3, 1, baseline_schedule="planner")
    assert ev.outcome("bamboo", ()).iteration_ms == pytest.approx(19.0)
    assert ev.outcome("bamboo", ((0, 1),)).iteration_ms == pytest.approx(28.0)
    # Stage 0 failing is modelled on stage 1's node: the same merged node, the same 28.
    assert ev.outcome("bamboo", ((0, 0),)).iteration_ms == pytest.approx(28.0)
    assert ev.outcome("bamboo", ((0, 1), (0, 2))).iteration_ms is None  # neighbours: restart
    assert ev.outcome("bamboo", ((0, 0), (0, 2))).iteration_ms is None  # ring neighbours


def test_baselines_run_an_unsplit_1f1b_by_default():
    # 2 stages, 2 micro-batches per pipeline (module docstring): 1F1B with W fused 21 ms, the
    # B/W-split plan 20 ms. Oobleck without failures keeps both pipelines at 2 micro-batches.
    default, favoured = evaluator(2, 2, 2), evaluator(2, 2, 2, baseline_schedule="planner")
    assert default.baseline_schedule == "1f1b"
    assert default.outcome("oobleck", ()).iteration_ms == pytest.approx(21.0)
    assert favoured.outcome("oobleck", ()).iteration_ms == pytest.approx(20.0)
    # Bamboo adds 1 ms to each W (slot w): 1F1B: F0 F1, B0 at 4, W0 ends 10, B1 arrives 11
    # (stage 1: F0 1-2, B0 2-4, W0 4-8, F1 8-9, B1 9-11), W1 ends 17, + 6 = 23;
    # B/W split: F0 F1 2, idle 2 until B0 arrives, B0 W0 B1 W1 2 x (2 + 4) = 12, + 6 = 22.
    assert default.outcome("bamboo", ()).iteration_ms == pytest.approx(23.0)
    assert favoured.outcome("bamboo", ()).iteration_ms == pytest.approx(22.0)
    # This project's own fault-free plan is the B/W-split one.
    assert default.fault_free_ms() == pytest.approx(20.0)


def test_the_1f1b_baseline_fuses_w_into_b():
    # W 1 instead of 3, 2 stages, 2 micro-batches. Fused 1F1B: stage 1 runs F0 1-2, B0 2-4, W0 4-5,
    # F1 5-6, B1 6-8; stage 0 runs F0 F1, B0 4-6, W0 6-7, waits for B1 until 8, B1 8-10, W1 10-11,
    # + 6 = 17. Split: stage 1's B1 ends at 7 (F1 4-5, B1 5-7), stage 0's W0 fills 6-7, B1 7-9,
    # W1 9-10, + 6 = 16 (= 2 x 4 of work + 2 idle + 6).
    job = JobSpec.parse({**ONE_STAGE, "pipelines": 2, "stages": 2, "microbatches": 2,
                         "backward_weight_ms": 1.0})
    assert Evaluator(job).outcome("oobleck", ()).iteration_ms == pytest.approx(17.0)
    favoured = Evaluator(job, baseline_schedule="planner")
    assert favoured.outcome("oobleck", ()).iteration_ms == pytest.approx(16.0)


def test_adaptive_is_cached_per_canonical_class():
    ev = evaluator(3, 2, 3)
    a = ev.outcome("adaptive", ((0, 1),))
    b = ev.outcome("adaptive", ((2, 1),))  # the same class
    assert a.iteration_ms == b.iteration_ms and len(ev._adaptive) == 1
