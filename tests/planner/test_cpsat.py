"""The CP-SAT model (planner/cp/cpsat.py, planner/cp/): each constraint family on tiny jobs, golden
optima CP-SAT must prove, and the never-worse / never-invalid guarantees of `improve`.

`CpResult.model_ops` is the CP solution's own times converted back to ms, so checking it with the
contract's validator tests the model's constraints directly (not only the re-timed `ops`).
"""

from __future__ import annotations

import pytest

from planner.bounds import lower_bound
from planner.cp import cpsat
from planner.cp.orders import relabel, retime, steady_state
from planner.cp.timing import choose_scale
from planner.dropping import dropped_job, relabel_dropped
from planner.failures import normalize
from planner.paper_style import paper_style_schedule
from planner.simulator import replay
from planner.solve import best_heuristic, plan
from planner.spec import JobSpec
from planner.timeline import orders_of
from planner.validate import peak_memory, validate

pytestmark = pytest.mark.timeout(120)


def make_job(pipelines: int, stages: int, microbatches: int, **over) -> JobSpec:
    spec = {
        "pipelines": pipelines, "stages": stages, "microbatches": microbatches,
        "forward_ms": 1.0, "backward_input_ms": 1.0, "backward_weight_ms": 1.0,
        "p2p_ms": 0.5, "cross_pipeline_p2p_ms": 1.5, "allreduce_ms": 2.0, "optimizer_ms": 1.0,
        "activation_mb": 1.0,
    }
    spec.update(over)
    return JobSpec.parse(spec)


def run_cp(job: JobSpec, failed=(), time_limit_s: float = 20.0, bound: bool = True, **kw):
    failed = normalize(job, failed).failed
    ops, period, _ = best_heuristic(job, failed)
    bound_ms = lower_bound(job, failed).value_ms if bound else 0.0
    return failed, period, cpsat.improve(job, failed, ops, period, bound_ms, time_limit_s, seed=0, **kw)


# ------------------------------------------------------------------------------ golden optima


@pytest.mark.parametrize("m", [1, 3, 5])
def test_single_worker_optimum_is_total_work(m):
    """1 pipeline x 1 stage x M: the worker runs M x (F+B+W) back to back, then ALLREDUCE and
    OPTIMIZER; nothing can overlap, so the period is exactly M*(F+B+W) + AR + OPT = 6M + 9 with
    F, B, W = 1, 2, 3 and AR, OPT = 4, 5. With S = 1 the model bound is exact (no unit lost)."""
    job = make_job(1, 1, m, forward_ms=1, backward_input_ms=2, backward_weight_ms=3,
                   allreduce_ms=4, optimizer_ms=5)
    _, _, res = run_cp(job, bound=False)
    assert res.cp_status == "OPTIMAL"
    assert res.model == "full"
    assert res.objective_ms == pytest.approx(6 * m + 9)
    assert res.bound_ms == pytest.approx(6 * m + 9)
    assert not validate(job, (), res.model_ops)


def test_two_stage_chain_optimum():
    """1 pipeline x 2 stages x 1 micro-batch, F = B = W = 1, hop 0.5, AR 2, OPT 1. Stage 0's
    worker runs F0, waits for F1 and B1 (each 0.5 hop away), runs B0, W0, ALLREDUCE, OPTIMIZER:
    span 1+0.5+1+1+0.5+1+1+2+1 = 9. Stage 1's span is 1+1+1+2+1 = 6. Period = 9."""
    job = make_job(1, 2, 1)
    _, _, res = run_cp(job, bound=False)
    assert res.cp_status == "OPTIMAL"
    assert res.objective_ms == pytest.approx(9.0)
    assert 9.0 - 0.01 <= res.bound_ms <= 9.0
    assert not validate(job, (), res.model_ops)
    assert replay(job, res.model_ops).iteration_ms == pytest.approx(9.0)


def test_memory_cap_of_one_serialises_microbatches():
    """1 x 2 x 3 with memory_limit_mb = activation: stage 0 may hold one micro-batch, so the next
    F waits for the previous W: each micro-batch costs F0+F1+B1+B0+W0 = 5 chained (hops 0) on
    stage 0's worker, period 3*5 + AR + OPT = 15 + 3 = 18. Without the cap it is lower."""
    tight = make_job(1, 2, 3, p2p_ms=0, cross_pipeline_p2p_ms=0, memory_limit_mb=1.0)
    _, _, res = run_cp(tight, bound=False)
    assert res.cp_status == "OPTIMAL"
    assert res.objective_ms == pytest.approx(18.0)
    assert max(peak_memory(tight, res.model_ops).values()) <= 1.0
    assert not validate(tight, (), res.model_ops)
    loose = make_job(1, 2, 3, p2p_ms=0, cross_pipeline_p2p_ms=0)
    _, _, res_loose = run_cp(loose, bound=False)
    assert res_loose.cp_status == "OPTIMAL"
    assert res_loose.objective_ms < 18.0 - 1e-6


# ------------------------------------------------------------------- constraint families, 2x2x2


@pytest.fixture(scope="module")
def rerouted():
    """2 x 2 x 2 with worker [0, 1] failed: its micro-batches run on [1, 1]."""
    job = make_job(2, 2, 2)
    failed, period, res = run_cp(job, [(0, 1)])
    return job, failed, period, res


def test_rerouted_solution_is_valid_and_on_alive_peer(rerouted):
    job, failed, _, res = rerouted
    assert res.cp_status in ("OPTIMAL", "FEASIBLE")
    assert not validate(job, failed, res.model_ops)
    for op in res.model_ops:
        assert op.worker not in failed
        if op.microbatch is not None and op.worker[1] == 1 and op.microbatch[0] == failed[0][0]:
            assert op.worker == (1, 1)


def test_precedences_use_same_or_cross_hop(rerouted):
    """A re-routed micro-batch pays cross_pipeline_p2p_ms (1.5) into and out of [1, 1]; its own
    pipeline's hops pay p2p_ms (0.5)."""
    job, _, _, res = rerouted
    at = {(o.kind, o.microbatch, o.worker[1]): o for o in res.model_ops if o.microbatch}
    for m in range(2):
        for home in range(2):
            f0, f1 = at[("F", (home, m), 0)], at[("F", (home, m), 1)]
            b0, b1 = at[("B", (home, m), 0)], at[("B", (home, m), 1)]
            hop = 0.5 if f0.worker[0] == f1.worker[0] else 1.5
            assert f1.start_ms >= f0.end_ms + hop - 1e-9
            assert b0.start_ms >= b1.end_ms + hop - 1e-9
            assert b1.start_ms >= f1.end_ms - 1e-9
    assert any(at[("F", (0, m), 0)].worker[0] != at[("F", (0, m), 1)].worker[0] for m in range(2))


def test_one_op_at_a_time_and_common_allreduce(rerouted):
    job, failed, _, res = rerouted
    by_worker = {}
    for op in res.model_ops:
        by_worker.setdefault(op.worker, []).append(op)
    for seq in by_worker.values():
        seq.sort(key=lambda o: o.start_ms)
        for a, b in zip(seq, seq[1:], strict=False):
            assert b.start_ms >= a.end_ms - 1e-9
    for s in range(job.stages):
        starts = {o.start_ms for o in res.model_ops if o.kind == "ALLREDUCE" and o.worker[1] == s}
        assert len(starts) == 1
        last_w = max(o.end_ms for o in res.model_ops if o.kind == "W" and o.worker[1] == s)
        assert starts.pop() >= last_w - 1e-9


def test_tight_memory_on_rerouted_peer():
    """[1, 1] runs 4 micro-batches (its own 2 and [0, 1]'s 2) but may hold only 2 at once."""
    job = make_job(2, 2, 2, memory_limit_mb=2.0)
    failed, _, res = run_cp(job, [(0, 1)])
    assert res.cp_status in ("OPTIMAL", "FEASIBLE")
    assert not validate(job, failed, res.model_ops)
    assert peak_memory(job, res.model_ops)[(1, 1)] <= 2.0


# ----------------------------------------------------------------------------- improve's promises


@pytest.mark.parametrize("failed", [[(0, 0)], [(1, 1)], [(0, 2), (1, 0)]])
def test_improve_never_worse_never_invalid(failed):
    """Hinted with the paper-style construction (29.0, 26.5 and 30.0 ms here), which the planner's
    own heuristic beats on all three (26.0, 25.0, 27.0), so CP-SAT has room to improve: its answer
    is better and valid, or nothing when it proved the hint optimal. (With the heuristic's own plan
    as the hint, [(0, 2), (1, 0)] at 27.0 ms is not proven optimal in 30 s: bound 26.0.)"""
    job = make_job(3, 3, 3, forward_ms=1.0, backward_input_ms=1.5, backward_weight_ms=0.5)
    failed = normalize(job, failed).failed
    hint = paper_style_schedule(job, failed)
    period = replay(job, hint).iteration_ms
    res = cpsat.improve(job, failed, hint, period, lower_bound(job, failed).value_ms, 5.0, seed=0)
    assert res.bound_ms <= period + 1e-6
    if res.ops is None:
        # Nothing back is only allowed when it is earned: CP-SAT proved the heuristic's period
        # optimal (its own optimum and its global bound both reach it, within one model unit).
        unit = 1.0 / res.scale
        assert res.cp_status == "OPTIMAL", res
        assert res.objective_ms >= period - unit and res.bound_ms >= period - unit, res
        return
    assert not validate(job, failed, res.ops)
    assert replay(job, res.ops).iteration_ms == pytest.approx(res.period_ms)
    assert res.bound_ms - 1e-6 <= res.period_ms < period


SYMMETRY_CASES = [
    ((3, 2, 2, {}), [(0, 1)]),
    ((3, 2, 2, {"memory_limit_mb": 2.0}), [(0, 0)]),
    ((2, 2, 3, {"memory_limit_mb": 2.0, "forward_ms": 1.5, "backward_weight_ms": 0.5}), [(1, 0)]),
    ((3, 2, 3, {"memory_limit_mb": 2.0, "forward_ms": 2.0, "backward_input_ms": 1.5}), [(0, 0)]),
    ((2, 3, 2, {"cross_pipeline_p2p_ms": 0.25}), [(0, 1)]),
]


@pytest.mark.parametrize("rule", ["per_home", "across_homes"])
@pytest.mark.parametrize(("shape", "failed"), SYMMETRY_CASES)
def test_symmetry_breaking_keeps_the_optimum(shape, failed, rule):
    """The rules only order interchangeable micro-batches (across homes: all of them in the full
    model), so the proven optimum must be the one found with no symmetry breaking at all. The cases
    have two or three alive stage-0 workers (the order is not strict there) and tight memory."""
    d, s, m, over = shape
    job = make_job(d, s, m, **over)
    _, _, with_sb = run_cp(job, failed, bound=False, symmetry=rule)
    _, _, without = run_cp(job, failed, bound=False, symmetry="none")
    assert with_sb.cp_status == without.cp_status == "OPTIMAL"
    assert with_sb.objective_ms == pytest.approx(without.objective_ms)


def test_the_cap_admits_a_hint_whose_span_is_above_its_period():
    """Where the replay settles into iterations of unequal length, the period (their mean) is below
    the least single-iteration span, and a cap at the period would make the hint infeasible. Here
    the period handed in is 1 ms below the single worker's hand-worked optimum, 6M + 9 = 27 ms
    (test above): the model must still start from the hint and prove 27, not report INFEASIBLE."""
    job = make_job(1, 1, 3, forward_ms=1, backward_input_ms=2, backward_weight_ms=3,
                   allreduce_ms=4, optimizer_ms=5)
    failed = normalize(job, ()).failed
    ops, period, _ = best_heuristic(job, failed)
    assert period == pytest.approx(27.0)
    res = cpsat.improve(job, failed, ops, period - 1.0, 0.0, 20.0, seed=0)
    assert res.cp_status == "OPTIMAL"
    assert res.objective_ms == pytest.approx(27.0)


def test_unknown_symmetry_rule_is_named():
    job = make_job(2, 2, 2)
    with pytest.raises(ValueError, match="symmetry: 'homes'"):
        run_cp(job, [(0, 1)], symmetry="homes")


def test_relabel_orders_stage0_forwards_across_homes():
    """The hint must satisfy the model's symmetry rule: after `relabel` with one class, labels in
    (home, index) order have non-decreasing stage-0 F starts, whatever the homes were."""
    job = make_job(3, 2, 3)
    failed = normalize(job, [(0, 0)]).failed
    ops, period, _ = best_heuristic(job, failed)
    moved = relabel(ops, same_class=lambda p, m: None)
    starts = sorted((o.microbatch, o.start_ms) for o in moved if o.kind == "F" and o.worker[1] == 0)
    assert [t for _, t in starts] == sorted(t for _, t in starts)
    assert len({o.microbatch for o in moved if o.kind == "F"}) == 9
    assert not validate(job, failed, moved)
    assert replay(job, moved).iteration_ms == pytest.approx(period)


def test_restricted_model_reports_no_global_bound(monkeypatch):
    monkeypatch.setattr(cpsat, "FULL_MAX_OPS", 10)
    job = make_job(2, 2, 3)
    failed, period, res = run_cp(job, [(0, 0)], time_limit_s=5.0)
    assert res.model.startswith("restricted (routing fixed")
    assert res.bound_ms == 0.0
    assert res.cp_status in ("OPTIMAL", "FEASIBLE")
    assert not validate(job, failed, res.model_ops)


def test_route_choices_count_the_full_models_route_literals():
    """Hand-counted: 6 x 7 x 11 with (0, 4) dead has 66 micro-batches, each with 6 candidates at six
    stages and 5 at stage 4; a stage with one survivor, or one pipeline, gives no choice at all."""
    assert cpsat.route_choices(make_job(6, 7, 11), [(0, 4)]) == 66 * (6 * 6 + 5)
    assert cpsat.route_choices(make_job(2, 2, 3), [(0, 1)]) == 6 * 2  # stage 1: one survivor
    assert cpsat.route_choices(make_job(1, 4, 8), []) == 0


def test_too_many_route_choices_fall_back_to_the_routing_fixed_model(monkeypatch):
    """The full model's presolve and loading do not stop at the wall limit, so above
    FULL_MAX_ROUTE_CHOICES `improve` builds the routing-fixed one, and `plan` gives the heuristic
    the larger share, as for jobs over FULL_MAX_OPS."""
    from planner.solve import HEURISTIC_SHARE_WITHOUT_FULL_CP, heuristic_budget_s

    job = make_job(2, 2, 3)  # (0, 0) dead: stage 0 has one survivor (no choice); stage 1: 6 x 2
    assert cpsat.route_choices(job, [(0, 0)]) == 12 and cpsat.full_model_fits(job, [(0, 0)])
    monkeypatch.setattr(cpsat, "FULL_MAX_ROUTE_CHOICES", 11)
    assert not cpsat.full_model_fits(job, [(0, 0)])
    failed, period, res = run_cp(job, [(0, 0)], time_limit_s=5.0)
    assert res.model.startswith("restricted (routing fixed") and res.bound_ms == 0.0
    assert heuristic_budget_s(job, 10.0, True, failed) == HEURISTIC_SHARE_WITHOUT_FULL_CP * 10.0
    monkeypatch.setattr(cpsat, "FULL_MAX_ROUTE_CHOICES", 12)
    _, _, res = run_cp(job, [(0, 0)], time_limit_s=5.0)
    assert res.model == "full"


def test_too_large_model_is_not_built(monkeypatch):
    monkeypatch.setattr(cpsat, "RESTRICTED_MAX_OPS", 10)
    _, _, res = run_cp(make_job(2, 2, 3), [(0, 0)])
    assert res.ops is None and res.bound_ms == 0.0 and res.cp_status == "UNKNOWN"
    assert res.model.startswith("restricted (not built")


def test_no_time_left_returns_nothing():
    _, _, res = run_cp(make_job(2, 2, 2), [(0, 0)], time_limit_s=0.0)
    assert res.ops is None and res.bound_ms == 0.0
    assert "no time left" in res.model


def test_solver_parameters_are_recorded():
    _, _, res = run_cp(make_job(1, 2, 2), time_limit_s=3.0)
    assert res.workers == cpsat.NUM_WORKERS
    assert res.parameters["num_workers"] == cpsat.NUM_WORKERS
    assert res.parameters["random_seed"] == 0
    assert 0 < res.parameters["max_time_in_seconds"] <= 3.0
    assert res.parameters["time_units_per_ms"] == 100


def test_wall_limited_solves_search_without_the_lp(monkeypatch):
    """The LP's root propagation and the feasibility pump ignore the wall limit (a 4.5 s full
    model ran 8 s), so a wall-limited solve hands CP-SAT `no_lp` as its full-problem subsolver and
    no pump; a deterministic run keeps CP-SAT's default portfolio (reproducible plans)."""
    from ortools.sat.python import cp_model

    seen = []
    solve = cp_model.CpSolver.Solve

    def spy(self, model, *args, **kwargs):
        seen.append((list(self.parameters.subsolvers), self.parameters.use_feasibility_pump))
        return solve(self, model, *args, **kwargs)

    monkeypatch.setattr(cp_model.CpSolver, "Solve", spy)
    _, _, res = run_cp(make_job(2, 2, 3), [(0, 0)], time_limit_s=3.0)
    assert seen == [(["no_lp"], False)]
    assert res.parameters["subsolvers"] == ("no_lp",) and res.parameters["use_feasibility_pump"] is False
    _, _, res = run_cp(make_job(2, 2, 3), [(0, 0)], time_limit_s=3.0, deterministic_time=1.0)
    assert seen[1] == ([], True) and "subsolvers" not in res.parameters


def test_plan_with_cp_is_valid_and_not_worse_than_heuristic():
    job = make_job(3, 3, 4, forward_ms=1.0, backward_input_ms=1.2, backward_weight_ms=0.7)
    result = plan(job, [(2, 1)], time_limit_s=4.0)
    assert not validate(job, result.failed, result.ops)
    heuristic = best_heuristic(job, normalize(job, [(2, 1)]).failed)[1]
    assert result.iteration_ms <= heuristic + 1e-6
    assert result.stats.cp_model == "full"


# ------------------------------------------------------------------------------ helpers' contracts


def test_relabel_and_steady_state_keep_validity_and_period():
    job = make_job(3, 3, 3)
    failed = normalize(job, [(1, 2)]).failed
    ops, period, _ = best_heuristic(job, failed)
    moved = relabel(ops, same_class=lambda p, m: None)
    assert not validate(job, failed, moved)
    assert replay(job, moved).iteration_ms == pytest.approx(period)
    warm = steady_state(job, orders_of(moved), period)
    assert not validate(job, failed, warm.ops)
    assert warm.max_span <= period + 1e-9
    again = retime(job, orders_of(warm.ops))
    assert replay(job, again.ops).iteration_ms == pytest.approx(period)


@pytest.mark.parametrize(("value", "scale", "exact"), [(0.75, 100, True), (0.615, 1000, True),
                                                       (1 / 3, 1000, False), (1e-4, 10_000, True)])
def test_time_scale(value, scale, exact):
    job = make_job(1, 2, 1, p2p_ms=value)
    chosen = choose_scale(job)
    assert (chosen.scale, chosen.exact) == (scale, exact)


def dissolved_1f1b_hint():
    """Pipeline 0 of a 3 x 4 x 4 job loses stage 0 and is dissolved (the dropped plan: its three
    alive workers run only ALLREDUCE and OPTIMIZER, rule 5) with 1F1B orders, which W's of 3 ms
    make slow: 45.0 ms against a bound of 39.0 that splitting the backward reaches."""
    job = make_job(3, 4, 4, backward_input_ms=1.0, backward_weight_ms=3.0)
    failed = normalize(job, [(0, 0)]).failed
    dropped = dropped_job(job, failed)
    hint = relabel_dropped(job, failed, dropped, paper_style_schedule(dropped, ()))
    assert not validate(job, failed, hint)
    return job, failed, hint, replay(job, hint).iteration_ms


def test_an_improved_plan_keeps_the_collectives_of_workers_that_serve_nothing():
    """The CP solution has no compute op on the dissolved pipeline's workers; its plan must still
    give them their all-reduce and optimizer (it once lost them, so the optimum was thrown away as
    invalid and nothing came back)."""
    job, failed, hint, period = dissolved_1f1b_hint()
    bound = lower_bound(job, failed).value_ms
    assert (period, bound) == (45.0, 39.0)
    res = cpsat.improve(job, failed, hint, period, bound, 60.0, seed=0, fixed_routing=True,
                        deterministic_time=5.0)
    assert res.ops is not None, res
    assert not validate(job, failed, res.ops)
    assert res.period_ms == pytest.approx(bound)
    idle = [(0, s) for s in range(1, 4)]
    assert {(o.worker, o.kind) for o in res.ops if o.worker in idle} == {
        (w, k) for w in idle for k in ("ALLREDUCE", "OPTIMIZER")}
