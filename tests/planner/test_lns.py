"""The large-neighbourhood search over order-fixed CP-SAT sub-models (planner/cp/lns.py).

Expected values come from the full CP-SAT model (planner/cp/cpsat.py), which proves its optimum on
these one-pipeline jobs (one pipeline: the routing is trivial, so the LNS's fixed routing loses
nothing and a neighbourhood freeing every op is the whole problem). Runs are reproducible: a fixed
number of sub-models, each under CP-SAT's deterministic time limit with one search worker; no
assertion depends on wall time.
"""

from __future__ import annotations

import pytest

from planner.cp import cpsat, lns
from planner.heuristic import Policy, list_schedule
from planner.routing import balanced_routing
from planner.simulator import replay
from planner.solve import _lns_step
from planner.spec import JobSpec
from planner.timeline import SolverStats, SolveStatus
from planner.validate import validate

TIGHT = dict(pipelines=1, stages=3, microbatches=6, forward_ms=1.0, backward_input_ms=2.0,
             backward_weight_ms=1.0, p2p_ms=0.0, allreduce_ms=1.0, optimizer_ms=1.0, activation_mb=1.0)


def _poor_plan(job: JobSpec):
    ops = list_schedule(job, balanced_routing(job, (), 0), Policy(w_tolerance=None, ahead_slack=0))
    return ops, replay(job, ops).iteration_ms


def _cp_optimum(job: JobSpec, ops, period: float) -> float:
    result = cpsat.improve(job, (), ops, period, 0.0, 120.0, 0, deterministic_time=30.0)
    assert result.cp_status == "OPTIMAL"
    return result.period_ms if result.ops is not None else period


def _whole_plan_lns(job, ops, period, monkeypatch, neighbourhoods=2):
    monkeypatch.setattr(lns, "FREE_OPS", (10_000,))  # one neighbourhood = every op
    monkeypatch.setattr(lns, "KINDS", ("window",))
    return lns.improve_lns(job, (), ops, period, 0.0, 600.0, 0, max_neighbourhoods=neighbourhoods,
                           sub_deterministic_time=2.0)


@pytest.mark.parametrize("memory", [2.0, 3.0])
def test_every_op_free_reaches_the_cp_optimum_and_keeps_memory(memory, monkeypatch):
    """Tight memory (2 or 3 micro-batches): the order-fixed sub-model with every op free must find
    the full model's optimum (37 and 30 ms from 39 and 33), and its plan must pass rule 6 (without
    the memory constraint the sub-model runs more forwards early: 27 ms, invalid)."""
    job = JobSpec.parse({**TIGHT, "memory_limit_mb": memory})
    ops, period = _poor_plan(job)
    optimum = _cp_optimum(job, ops, period)
    assert optimum < period
    result = _whole_plan_lns(job, ops, period, monkeypatch)
    assert result.status is SolveStatus.IMPROVED
    assert not validate(job, (), result.ops)
    assert replay(job, result.ops).iteration_ms == result.period_ms == optimum


def test_nothing_returned_from_an_optimal_plan(monkeypatch):
    job = JobSpec.parse({**TIGHT, "memory_limit_mb": 3.0})
    ops, period = _poor_plan(job)
    best = _whole_plan_lns(job, ops, period, monkeypatch)
    again = _whole_plan_lns(job, best.ops, best.period_ms, monkeypatch)
    assert again.ops is None and again.status is SolveStatus.HEURISTIC
    assert again.period_ms == best.period_ms


def test_reproducible_with_a_fixed_number_of_sub_models():
    """Default neighbourhoods (windows of the plan, not all of it) on a job with failures."""
    job = JobSpec.parse(dict(pipelines=3, stages=3, microbatches=6, forward_ms=1.0, backward_input_ms=1.0,
                             backward_weight_ms=1.0, p2p_ms=0.0, allreduce_ms=1.0, optimizer_ms=1.0,
                             activation_mb=1.0))
    failed = ((0, 1), (1, 2))
    ops = list_schedule(job, balanced_routing(job, failed, 0), Policy(w_tolerance=None, ahead_slack=0))
    period = replay(job, ops).iteration_ms
    runs = [lns.improve_lns(job, failed, ops, period, 0.0, 600.0, 3, max_neighbourhoods=4,
                            sub_deterministic_time=0.2) for _ in range(2)]
    assert runs[0].period_ms == runs[1].period_ms <= period
    assert runs[0].accepted == runs[1].accepted and runs[0].neighbourhoods == 4
    if runs[0].ops is not None:
        assert not validate(job, failed, runs[0].ops)
        assert [(o.worker, o.kind, o.microbatch, o.start_ms) for o in runs[0].ops] == \
            [(o.worker, o.kind, o.microbatch, o.start_ms) for o in runs[1].ops]


def test_solve_step_records_the_lns_with_its_parameters():
    """planner/solve.py's LNS step: the plan it keeps is valid and never worse, and the sub-solver's
    parameters are recorded with the result (and in the summary JSON)."""
    job = JobSpec.parse({**TIGHT, "pipelines": 3, "microbatches": 4, "memory_limit_mb": 3.0})
    failed = ((0, 0), (1, 2))
    ops = list_schedule(job, balanced_routing(job, failed, 0), Policy(w_tolerance=None, ahead_slack=0))
    period = replay(job, ops).iteration_ms
    stats = SolverStats(status=SolveStatus.HEURISTIC, objective_ms=period, bound_ms=0.0,
                        heuristic_ms=period, wall_s=0.0, time_limit_s=1.0)
    kept, kept_period = _lns_step(job, failed, ops, period, 0.0, 1.0, 0, stats)
    assert not validate(job, failed, kept)
    assert replay(job, kept).iteration_ms == kept_period <= period
    assert stats.lns is not None and stats.lns["neighbourhoods"] >= 1
    assert stats.lns["parameters"]["num_workers"] == 1
    assert stats.lns["parameters"]["cp_model_presolve"] is False
    assert stats.to_json()["lns"] == stats.lns


def test_an_accepted_plan_keeps_the_collectives_of_workers_that_serve_nothing():
    """From a dissolved pipeline's 1F1B plan (its alive workers run only ALLREDUCE and OPTIMIZER;
    see test_cpsat.dissolved_1f1b_hint) the search reaches the bound, 39.0 ms, and its plan is valid:
    it once re-timed only the workers with compute ops, so every plan it found from a dropped plan
    lacked those workers' all-reduce and was thrown away by the planner."""
    from tests.planner.test_cpsat import dissolved_1f1b_hint

    job, failed, hint, period = dissolved_1f1b_hint()
    result = lns.improve_lns(job, failed, hint, period, 39.0, 60.0, 0, max_neighbourhoods=10,
                             sub_deterministic_time=0.5)
    assert result.ops is not None
    assert not validate(job, failed, result.ops)
    assert result.period_ms == pytest.approx(39.0)
