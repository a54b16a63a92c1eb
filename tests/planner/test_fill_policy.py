"""The list scheduler's fill-the-round-trip warm-up (`Policy.fill_round_trip`, planner/heuristic.py)
and when the grid tries it (`candidates.fill_policies`).

Hand-worked: 1 x 3 x 8, every op 1 ms, no hops or collectives, memory 8 micro-batches. Micro-batch
0's gradient is back at stage 0 at t = 5 (F at stages 0, 1, 2 end at 1, 2, 3; B at 2 and 1 end at
4 and 5), so stage 0 can run ceil((F + round trip) / F) = ceil((1 + 4) / 1) = 5 forwards first and
never idles: the period is its work, 8 x 3 = 24 ms. 1F1B's cap (S - s = 3 forwards) idles 2 ms
before the first B (26 ms), one forward fewer than the fill (slack -1) idles 1 ms (25 ms).
"""

from __future__ import annotations

import pytest

from planner.candidates import fill_policies, heuristic_policies
from planner.heuristic import Policy, list_schedule
from planner.routing import balanced_routing
from planner.simulator import replay
from planner.spec import JobSpec
from planner.validate import validate

UNIT = dict(pipelines=1, stages=3, microbatches=8, forward_ms=1.0, backward_input_ms=1.0,
            backward_weight_ms=1.0, p2p_ms=0.0, allreduce_ms=0.0, optimizer_ms=0.0,
            activation_mb=1.0, memory_limit_mb=8.0)


def _forwards_before_first_b(ops, worker):
    seq = sorted((o for o in ops if o.worker == worker), key=lambda o: o.start_ms)
    return next(i for i, o in enumerate(seq) if o.kind == "B")


@pytest.mark.parametrize("policy, forwards, period", [
    (Policy(fill_round_trip=True), 5, 24.0),
    (Policy(fill_round_trip=True, ahead_slack=-1), 4, 25.0),
    (Policy(), 3, 26.0),  # 1F1B's warm-up, for contrast
])
def test_fill_warm_up_on_the_hand_worked_job(policy, forwards, period):
    job = JobSpec.parse(UNIT)
    ops = list_schedule(job, balanced_routing(job, (), 0), policy)
    assert not validate(job, (), ops)
    assert _forwards_before_first_b(ops, (0, 0)) == forwards
    assert replay(job, ops).iteration_ms == period


def test_fill_stays_within_memory():
    """With room for 3 micro-batches the cap of 5 is never reached: memory still binds (rule 6)."""
    job = JobSpec.parse({**UNIT, "memory_limit_mb": 3.0})
    ops = list_schedule(job, balanced_routing(job, (), 0), Policy(fill_round_trip=True))
    assert not validate(job, (), ops)
    assert _forwards_before_first_b(ops, (0, 0)) == 3


def test_fill_policies_only_when_stage_0_may_hold_more_than_s_forwards():
    one_f_one_b = JobSpec.parse({**UNIT, "memory_limit_mb": 3.0})  # S activations
    assert fill_policies(one_f_one_b) == []
    assert not any(p.fill_round_trip for p in heuristic_policies(one_f_one_b))
    roomy = JobSpec.parse(UNIT)
    grid = heuristic_policies(roomy)
    assert len(fill_policies(roomy)) == 12
    assert all(p.fill_round_trip for p in grid[:12]) and not any(p.fill_round_trip for p in grid[12:])
