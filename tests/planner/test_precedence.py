"""The one precedence graph (planner/precedence.py) against the contract's rules 3 and 5, by hand.

Job: 2 pipelines x 2 stages x 1 micro-batch, worker [1, 1] failed, so micro-batch [1, 0] runs
stage 0 on [1, 0] and stage 1 on [0, 1] (re-routed): its hops are cross-pipeline. All ops last
1 ms, p2p 0.5 ms, cross-pipeline 0.8 ms. Every edge below is read off the contract's text.
"""

from __future__ import annotations

import pytest

from planner.cp.orders import retime
from planner.precedence import edges, needs
from planner.simulator import replay
from planner.spec import JobSpec
from planner.timeline import Op, orders_of
from planner.validate import validate

JOB = JobSpec.parse({
    "pipelines": 2, "stages": 2, "microbatches": 1,
    "forward_ms": 1.0, "backward_input_ms": 1.0, "backward_weight_ms": 1.0,
    "p2p_ms": 0.5, "cross_pipeline_p2p_ms": 0.8, "allreduce_ms": 1.0, "optimizer_ms": 1.0,
    "activation_mb": 1.0,
})
FAILED = [(1, 1)]


def plan(b10_stage0_start: float = 6.3) -> list[Op]:
    """Every op as early as the rules allow (worked by hand; see test_replay_of_the_hand_plan).
    Stage 1's worker [0, 1] runs F00, F10, B00, B10, W00, W10, then its collectives."""
    t = b10_stage0_start
    ar0 = t + 2.0  # B10 and W10 on [1, 0] end at t + 2: the last W of stage 0
    return [
        Op((0, 0), "F", (0, 0), 0.0, 1.0), Op((1, 0), "F", (1, 0), 0.0, 1.0),
        Op((0, 1), "F", (0, 0), 1.5, 2.5),  # F00 at stage 0 ends 1.0, + p2p 0.5
        Op((0, 1), "F", (1, 0), 2.5, 3.5),  # input at 1.0 + 0.8, but the worker is busy until 2.5
        Op((0, 1), "B", (0, 0), 3.5, 4.5), Op((0, 1), "B", (1, 0), 4.5, 5.5),
        Op((0, 1), "W", (0, 0), 5.5, 6.5), Op((0, 1), "W", (1, 0), 6.5, 7.5),
        Op((0, 1), "ALLREDUCE", None, 7.5, 8.5), Op((0, 1), "OPTIMIZER", None, 8.5, 9.5),
        Op((0, 0), "B", (0, 0), 5.0, 6.0),  # B00 at stage 1 ends 4.5, + p2p 0.5
        Op((0, 0), "W", (0, 0), 6.0, 7.0),
        Op((1, 0), "B", (1, 0), t, t + 1.0),  # B10 at stage 1 ends 5.5, + cross 0.8 = 6.3
        Op((1, 0), "W", (1, 0), t + 1.0, t + 2.0),
        Op((0, 0), "ALLREDUCE", None, ar0, ar0 + 1.0), Op((0, 0), "OPTIMIZER", None, ar0 + 1.0, ar0 + 2.0),
        Op((1, 0), "ALLREDUCE", None, ar0, ar0 + 1.0), Op((1, 0), "OPTIMIZER", None, ar0 + 1.0, ar0 + 2.0),
    ]


def name(op: Op) -> str:
    mb = "" if op.microbatch is None else f"{op.microbatch[0]}{op.microbatch[1]}"
    return f"{op.kind}{mb}@{op.worker[0]}{op.worker[1]}"


def test_every_edge_of_the_2x2_job_by_hand():
    expected = {
        # rule 3: F at s after F at s-1 plus the hop (cross when the pipelines differ)
        ("F00@00", "F00@01", 0.5), ("F10@10", "F10@01", 0.8),
        # rule 3: on the last stage B after its F
        ("F00@01", "B00@01", 0.0), ("F10@01", "B10@01", 0.0),
        # rule 3: B at s after B at s+1 plus the hop
        ("B00@01", "B00@00", 0.5), ("B10@01", "B10@10", 0.8),
        # rule 3: W after its B
        ("B00@00", "W00@00", 0.0), ("B10@10", "W10@10", 0.0),
        ("B00@01", "W00@01", 0.0), ("B10@01", "W10@01", 0.0),
        # rule 5: every ALLREDUCE of a stage after every W of that stage
        ("W00@00", "ALLREDUCE@00", 0.0), ("W10@10", "ALLREDUCE@00", 0.0),
        ("W00@00", "ALLREDUCE@10", 0.0), ("W10@10", "ALLREDUCE@10", 0.0),
        ("W00@01", "ALLREDUCE@01", 0.0), ("W10@01", "ALLREDUCE@01", 0.0),
        # rule 5: each worker's OPTIMIZER after its ALLREDUCE
        ("ALLREDUCE@00", "OPTIMIZER@00", 0.0), ("ALLREDUCE@10", "OPTIMIZER@10", 0.0),
        ("ALLREDUCE@01", "OPTIMIZER@01", 0.0),
    }
    got = [(name(a), name(b), d) for a, b, d in edges(JOB, plan())]
    assert len(got) == len(set(got)) == 19
    assert set(got) == expected


def test_needs_per_kind_and_stage_by_hand():
    table = {k: (n.source, n.source_stage, n.same_ms, n.cross_ms) for k, n in needs(JOB.costs, 2).items()}
    assert table == {
        ("F", 1): ("F", 0, 0.5, 0.8),
        ("B", 1): ("F", 1, 0.0, 0.0),
        ("B", 0): ("B", 1, 0.5, 0.8),
        ("W", 0): ("B", 0, 0.0, 0.0),
        ("W", 1): ("B", 1, 0.0, 0.0),
    }  # F on stage 0 waits for nothing


def test_the_validator_takes_the_cross_hop_from_the_graph():
    assert validate(JOB, FAILED, plan()) == []
    # B10 at stage 0 waiting only the same-pipeline hop (5.5 + 0.5) breaks rule 3.
    problems = validate(JOB, FAILED, plan(b10_stage0_start=6.0))
    assert problems == ["rule 3: B of [1, 0] at stage 0 starts before its gradient arrives"]


def test_replay_of_the_hand_plan():
    """The first replayed iteration is the hand schedule above: stage 0's collectives start when
    W10 ends at 6.3 + 2 = 8.3 and its OPTIMIZER ends at 10.3 (the cross hop is on that path)."""
    report = replay(JOB, plan(), iterations=3)
    assert report.iteration_end_ms[0] == pytest.approx(10.3, abs=1e-9)


def test_cp_retime_of_the_hand_orders_is_the_hand_plan():
    """CP-SAT's re-timing (planner/cp/orders.py) of the hand plan's orders, every op as early as
    the graph allows, gives back exactly the hand-worked times."""
    got = sorted((o.worker, o.kind, o.microbatch or (), round(o.start_ms, 9), round(o.end_ms, 9))
                 for o in retime(JOB, orders_of(plan())).ops)
    want = sorted((o.worker, o.kind, o.microbatch or (), round(o.start_ms, 9), round(o.end_ms, 9))
                  for o in plan())
    assert got == want
