"""The ReCycle paper's construction (planner/paper_style.py), its baseline with CP-SAT
(evaluation/paper_planner.py), and the planner never behind either on small jobs."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from evaluation.paper_planner import paper_plan
from planner.candidates import best_heuristic
from planner.failures import normalize
from planner.fault_free import fault_free_plan
from planner.paper_style import one_f_one_b_template, paper_style_schedule, round_robin_routing
from planner.simulator import replay
from planner.solve import plan
from planner.spec import JobSpec
from planner.validate import validate


def job_of(D, S, M, **extra) -> JobSpec:
    return JobSpec.parse(dict(pipelines=D, stages=S, microbatches=M, forward_ms=1.0, backward_input_ms=2.0,
                              backward_weight_ms=3.0, p2p_ms=0.0, allreduce_ms=1.0, optimizer_ms=1.0,
                              activation_mb=1.0, **extra))


def test_round_robin_by_hand():
    """Failed (0, 1) of a 3 x 2 x 4 job: its micro-batches 0..3 go to peers 1, 2, 1, 2; with (0, 0) and
    (1, 0) failed, stage 0's micro-batches go (index, then home) to the only peer, pipeline 2."""
    r = round_robin_routing(job_of(3, 2, 4), ((0, 1),))
    assert [r.executor(0, m, 1) for m in range(4)] == [1, 2, 1, 2]
    assert [r.executor(0, m, 0) for m in range(4)] == [0, 0, 0, 0]  # stage 0 of pipeline 0 is alive
    assert r.load == [[4, 0], [4, 6], [4, 6]]
    r = round_robin_routing(job_of(3, 1, 2), ((0, 0), (1, 0)))
    assert r.load == [[0], [0], [6]]


def test_single_stage_period_by_hand():
    """D=2, S=1, M=2, (0, 0) failed: the peer runs 4 x (F 1 + B 2 + W 3) then all-reduce 1 and
    optimizer 1 back to back, with nothing to wait for: period 26 ms."""
    job = job_of(2, 1, 2)
    ops = paper_style_schedule(job, ((0, 0),))
    assert validate(job, ((0, 0),), ops) == []
    assert abs(replay(job, ops).iteration_ms - 26.0) < 1e-9


def test_template_is_1f1b():
    """Stage s of the template runs S - s forwards before its first B, then alternates B and F."""
    job = job_of(1, 3, 5)
    ops = one_f_one_b_template(job)
    for s in range(3):
        seq = [o.kind for o in sorted(ops, key=lambda o: o.start_ms) if o.worker == (0, s) and o.kind in "FB"]
        warm = 3 - s
        assert seq[:warm] == ["F"] * warm and seq[warm] == "B"
        steady = seq[warm:warm + 2 * (5 - warm)]
        assert steady == ["B", "F"] * (5 - warm)


@st.composite
def failure_cases(draw):
    D, S = draw(st.integers(2, 4)), draw(st.integers(1, 4))
    M = draw(st.integers(1, 6))
    job = JobSpec.parse(dict(
        pipelines=D, stages=S, microbatches=M,
        forward_ms=draw(st.lists(st.sampled_from([1.0, 1.5, 2.0]), min_size=S, max_size=S)),
        backward_input_ms=draw(st.sampled_from([1.0, 2.0])),
        backward_weight_ms=draw(st.sampled_from([0.5, 1.5])), p2p_ms=0.1,
        cross_pipeline_p2p_ms=draw(st.sampled_from([0.1, 0.3])), allreduce_ms=1.0, optimizer_ms=0.5,
        activation_mb=1.0, activation_w_mb=draw(st.sampled_from([1.0, 0.5])),
        memory_limit_mb=float(S * draw(st.sampled_from([1, 2])))))
    workers = [(p, s) for p in range(D) for s in range(S)]
    failed = draw(st.lists(st.sampled_from(workers), min_size=1, max_size=4, unique=True))
    if any(all((p, s) in failed for p in range(D)) for s in range(S)):
        failed = [w for w in failed if w[0] != D - 1]  # keep a survivor in every stage
    return job, tuple(sorted(failed))


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(failure_cases())
def test_construction_is_valid_and_planner_never_behind_it(case):
    job, failed = case
    if not failed:
        return
    canonical = normalize(job, failed).failed
    ops = paper_style_schedule(job, canonical)
    assert ops is not None  # the shallow-warm-up fallback always exists
    assert validate(job, canonical, ops) == []
    paper = replay(job, ops).iteration_ms
    template = list(fault_free_plan(job).ops)
    _, ours, _ = best_heuristic(job, canonical, 0.0, budget_s=float("inf"), template=template)
    assert ours <= paper + 1e-6


def test_baseline_keeps_round_robin_routing_and_is_valid():
    """The baseline's CP-SAT step keeps the routing (it is the paper's method, not the planner's)."""
    job = job_of(3, 2, 4)
    result = paper_plan(job, [(0, 1)], time_limit_s=3.0)
    assert validate(job, result.failed, result.ops) == []
    assert result.iteration_ms <= result.constructive_ms + 1e-9
    assert result.cp_model.startswith("restricted"), result.cp_model  # not the free-routing model
    routing = round_robin_routing(job, result.failed)
    for op in result.ops:
        if op.kind in ("F", "B", "W"):
            home, m = op.microbatch
            assert op.worker == (routing.executor(home, m, op.worker[1]), op.worker[1])
    ours = plan(job, [(0, 1)], time_limit_s=3.0, use_cp=False)
    assert ours.iteration_ms <= result.constructive_ms + 1e-6
