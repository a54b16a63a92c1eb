"""Rule 6 with `activation_w_mb` (item D): a micro-batch holds `activation_mb` from its F start to
its B end and `activation_w_mb` from its B end to its W end. Worked by hand on one pipeline of two
stages, two micro-batches, F = B = W = 1 ms, no hop, no all-reduce or optimizer time, activation 2 MB.

Stage 0 can hold one micro-batch in full (limit 2 or 2.5 MB, or 3 MB with activation_w 1 MB):
- DEFERRED (period 9): F0 [0,1], stage 1 F0 [1,2] B0 [2,3], B0 [3,4], F1 [4,5] with micro-batch 0's
  W still pending, W0 [5,6] while micro-batch 1 travels, B1 [7,8], W1 [8,9]. Just after F1 starts,
  stage 0 holds activation_w (micro-batch 0) + 2 MB (micro-batch 1).
- EAGER (period 10): W0 [4,5] before F1 [5,6]; stage 0 never holds more than 2 MB.
Bounds (planner/bounds.py, derived by hand): stage 0 runs 2 x 3 ms of work; its first B comes
2 ms after F0 ends (F1 + B1 at stage 1), so 2 ms of fill idle; after its last F it waits 2 ms for
that gradient, during which it can run only what it holds: W0 (1 ms) when the memory allows F1
to start beside a pending W0, else nothing. Bound 6 + 2 + 1 = 9 or 6 + 2 + 2 = 10.
"""

from __future__ import annotations

import pytest

from planner.bounds import lower_bound
from planner.simulator import replay
from planner.solve import plan
from planner.spec import JobSpec
from planner.timeline import Op
from planner.validate import peak_memory, validate

BASE = dict(pipelines=1, stages=2, microbatches=2, forward_ms=1.0, backward_input_ms=1.0,
            backward_weight_ms=1.0, p2p_ms=0.0, allreduce_ms=0.0, optimizer_ms=0.0, activation_mb=2.0)


def job(activation_w: float, limit: float) -> JobSpec:
    return JobSpec.parse({**BASE, "activation_w_mb": activation_w, "memory_limit_mb": limit})


def deferred_ops() -> list[Op]:
    def op(stage, kind, m, start):
        return Op((0, stage), kind, (0, m), float(start), float(start + 1))

    ops = [op(0, "F", 0, 0), op(1, "F", 0, 1), op(1, "B", 0, 2), op(1, "W", 0, 3), op(0, "B", 0, 3),
           op(0, "F", 1, 4), op(0, "W", 0, 5), op(1, "F", 1, 5), op(1, "B", 1, 6), op(1, "W", 1, 7),
           op(0, "B", 1, 7), op(0, "W", 1, 8)]
    for stage, at in ((0, 9.0), (1, 9.0)):
        ops += [Op((0, stage), "ALLREDUCE", None, at, at), Op((0, stage), "OPTIMIZER", None, at, at)]
    return ops


@pytest.mark.parametrize(("activation_w", "limit", "valid", "peak"), [
    (0.0, 2.0, True, 2.0),    # W0 pending holds nothing
    (1.0, 3.0, True, 3.0),    # exactly at the limit: 1 + 2
    (1.0, 2.999, False, 3.0),  # 1 MB over... by 0.001
    (0.001, 2.0, False, 2.001),
    (2.0, 3.0, False, 4.0),   # activation_w = activation (the default): 2 + 2
])
def test_the_deferred_plan_is_accepted_exactly_up_to_the_limit(activation_w, limit, valid, peak):
    j = job(activation_w, limit)
    ops = deferred_ops()
    assert peak_memory(j, ops)[(0, 0)] == pytest.approx(peak)
    assert (validate(j, [], ops) == []) is valid
    assert replay(j, ops).iteration_ms == pytest.approx(9.0)


@pytest.mark.parametrize(("activation_w", "limit", "best"), [
    (0.0, 2.0, 9.0), (1.0, 3.0, 9.0), (1.0, 2.5, 10.0), (2.0, 3.0, 10.0),
    # Two in full (limit 4): F0 F1 back to back, B0 [3,4] W0 B1 W1 -> 7; the bound: 6 ms work plus
    # fill 1 (F0 + 2 - 2 x F), drain 0 (B + W of micro-batch 0 fill the wait), the larger of the two.
    (2.0, 4.0, 7.0)])
def test_bound_and_heuristic_plan_use_activation_w(activation_w, limit, best):
    j = job(activation_w, limit)
    assert lower_bound(j, []).value_ms == pytest.approx(best)
    result = plan(j, [], use_cp=False)
    assert validate(j, [], result.ops) == []
    assert result.iteration_ms == pytest.approx(best)


@pytest.mark.parametrize(("activation_w", "limit", "best"), [(1.0, 3.0, 9.0), (1.0, 2.5, 10.0)])
def test_cp_model_holds_activation_w_from_b_end_to_w_end(activation_w, limit, best):
    from planner.cp import cpsat

    j = job(activation_w, limit)
    # Warm start from the EAGER plan (every W right after its B, period 10) and no analytic bound:
    # the model alone must find 9 where rule 6 allows it and prove 10 where it does not.
    from planner.routing import balanced_routing
    from planner.sweep import SweepPolicy, sweep_schedule

    hint = sweep_schedule(j, balanced_routing(j, ()), SweepPolicy(fused_backward=True))
    assert replay(j, hint).iteration_ms == pytest.approx(10.0)
    result = cpsat.improve(j, (), hint, 10.0, 0.0, 20.0, 0)
    assert result.parameters["memory_exact"] is True
    assert result.cp_status == "OPTIMAL"
    assert result.objective_ms == pytest.approx(best)
    assert best - 0.01 <= result.bound_ms <= best
    if best < 10.0:
        assert result.period_ms == pytest.approx(best)
        assert validate(j, [], result.model_ops) == []  # the model's own times obey rule 6


def test_round_trip_bound_counts_pending_ws_at_activation_w():
    """One pipeline, two stages, four micro-batches, F = B = 3, W = 2, no hop/all-reduce/optimizer,
    activation 2 MB, activation_w 0, limit 4 MB. By hand: stage 1 runs F B F B F B F B (holding at
    most 2 MB: one micro-batch in full, the others' pending W's hold nothing), then its four W's;
    stage 0 runs F0 F1 (4 MB), B0 F2 B1 F3 B2, W0 W1, B3, W2 W3. Both end at 35 ms and start at 0 /
    3 ms: period 35. The round-trip bound that assumed only k = limit / activation = 2 micro-batches
    fit at stage 1 (so 4 - 2 = 2 W's before its last B) claimed 3 + 24 + 4 + 3 + 2 = 36: false."""
    j = JobSpec.parse({**BASE, "microbatches": 4, "forward_ms": 3.0, "backward_input_ms": 3.0,
                       "backward_weight_ms": 2.0, "activation_w_mb": 0.0, "memory_limit_mb": 4.0})

    def seq(stage, items):
        return [Op((0, stage), k, (0, m), float(t), float(t + (2 if k == "W" else 3))) for k, m, t in items]

    ops = seq(0, [("F", 0, 0), ("F", 1, 3), ("B", 0, 9), ("F", 2, 12), ("B", 1, 15), ("F", 3, 18),
                  ("B", 2, 21), ("W", 0, 24), ("W", 1, 26), ("B", 3, 28), ("W", 2, 31), ("W", 3, 33)])
    ops += seq(1, [("F", 0, 3), ("B", 0, 6), ("F", 1, 9), ("B", 1, 12), ("F", 2, 15), ("B", 2, 18),
                   ("F", 3, 21), ("B", 3, 24), ("W", 0, 27), ("W", 1, 29), ("W", 2, 31), ("W", 3, 33)])
    for stage in (0, 1):
        ops += [Op((0, stage), "ALLREDUCE", None, 35.0, 35.0), Op((0, stage), "OPTIMIZER", None, 35.0, 35.0)]
    assert validate(j, [], ops) == []
    assert peak_memory(j, ops) == {(0, 0): 4.0, (0, 1): 2.0}
    assert replay(j, ops).iteration_ms == 35.0
    # Stage 0: 4 x 8 ms work + fill (3 + 6 - 2 x 3) + no drain idle (B + W of one held micro-batch
    # and the two pending W's cover the 6 ms wait) = 35, reached by the plan above.
    assert lower_bound(j, []).value_ms == 35.0
    assert plan(j, [], use_cp=False).iteration_ms == 35.0


@pytest.mark.parametrize(("activation_w", "limit", "best"),
                         [(0.0, 2.0, 9.0), (1.0, 3.0, 9.0), (1.0, 2.5, 10.0)])
def test_each_constructive_scheduler_uses_activation_w(activation_w, limit, best):
    """The sweep and the list scheduler each, on their own: DEFERRED where rule 6 allows it,
    never an invalid plan where it does not."""
    from planner.heuristic import list_schedule
    from planner.routing import balanced_routing
    from planner.solve import SWEEP_POLICIES, heuristic_policies
    from planner.sweep import sweep_schedule

    j = job(activation_w, limit)
    routing = balanced_routing(j, ())
    for name, schedules in (("sweep", [sweep_schedule(j, routing, p) for p in SWEEP_POLICIES]),
                            ("list", [list_schedule(j, routing, p) for p in heuristic_policies(j)])):
        done = [ops for ops in schedules if ops is not None]
        assert done, name
        for ops in done:
            assert validate(j, [], ops) == [], name
        assert min(replay(j, ops).iteration_ms for ops in done) == best, name


def test_list_scheduler_releases_only_activation_w_at_w_end():
    """Three micro-batches, one held at a time at stage 0 (activation 2, activation_w 0, limit 2).
    Counting a W's release as `activation_mb` (again, after B already gave back all but
    activation_w) lets the list scheduler start F2 while micro-batch 1 is still held: 4 MB."""
    from planner.heuristic import list_schedule
    from planner.routing import balanced_routing
    from planner.solve import heuristic_policies

    j = JobSpec.parse({**BASE, "microbatches": 3, "activation_w_mb": 0.0, "memory_limit_mb": 2.0})
    routing = balanced_routing(j, ())
    schedules = [ops for ops in (list_schedule(j, routing, p) for p in heuristic_policies(j)) if ops]
    assert schedules
    for ops in schedules:
        assert validate(j, [], ops) == []
        assert max(peak_memory(j, ops).values()) <= 2.0
