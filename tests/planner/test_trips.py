"""Trip-by-trip schedules where a stage is left to one worker (`planner.trips`; issue 8, the 1.03
bar on made-up jobs)."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from planner.bounds import lower_bound
from planner.cp.orders import retime
from planner.simulator import replay
from planner.solve import plan
from planner.spec import JobSpec
from planner.trips import TRIPS_MAX_OPS, lone_survivor_stages, trip_candidates, trip_orders, trips_apply
from planner.validate import peak_memory, validate
from tests.planner.test_properties import SETTINGS, jobs

# Made-up 2 x 2 x 22 (gap_unseen.py --seed 70, job 4): stage 0 left to (0, 0), which holds two
# micro-batches (7.8 MB over 3.9), and a W frees a slot (activation_w = activation).
LONE = {"pipelines": 2, "stages": 2, "microbatches": 22, "forward_ms": [2.5, 5.9],
        "backward_input_ms": [2.4, 5.3], "backward_weight_ms": [1.5, 3.2], "p2p_ms": 0.19,
        "cross_pipeline_p2p_ms": 2.59, "allreduce_ms": 29.8, "optimizer_ms": 0.6,
        "activation_mb": [3.9, 2.4], "activation_w_mb": [3.9, 2.4], "memory_limit_mb": 7.8}
FAILED = ((1, 0),)


def hand_pattern(job: JobSpec) -> dict:
    """The periodic schedule worked out by hand (module docstring of `planner.trips`), built
    without it: slot A runs trips own, own, crossed (own: stage 1 on pipeline 0, crossed: on
    pipeline 1), slot B the same half a cycle later, starting with its crossed trip. A trip's ops
    are placed at the times of that pattern; the stage-1 W's go into the first gap that holds
    them before the next trip's F. Only the orders are returned (`retime` times them)."""
    F0, B0, W0 = 2.5, 2.4, 1.5
    F1, B1, W1 = 5.9, 5.3, 3.2
    own_hop, cross_hop = 0.19, 2.59
    own = F0 + own_hop + F1 + B1 + own_hop + B0 + W0            # 17.98 ms a slot
    crossed = own + 2 * (cross_hop - own_hop)                    # 22.78
    cycle = ["own", "own", "crossed"]

    def slot(start: float, first: int) -> list[tuple[float, str]]:
        trips, at, i = [], start, first
        while len(trips) < 30:
            kind = cycle[i % 3]
            trips.append((at, kind))
            at += own if kind == "own" else crossed
            i += 1
        return trips

    half = (2 * own + crossed) / 2
    starts = sorted(slot(0.0, 0) + slot(half - crossed, 2))[:44]
    events: dict[tuple[int, int], list] = {(0, 0): [], (0, 1): [], (1, 1): []}
    ws: dict[tuple[int, int], list] = {(0, 1): [], (1, 1): []}
    for k, (at, kind) in enumerate(starts):
        home, m = divmod(k, 22)
        peer, hop = ((0, 1), own_hop) if kind == "own" else ((1, 1), cross_hop)
        events[(0, 0)].append((at, ("F", home, m, 0)))
        events[peer] += [(at + F0 + hop, ("F", home, m, 1)), (at + F0 + hop + F1, ("B", home, m, 1))]
        ws[peer].append((at + F0 + hop + F1 + B1, ("W", home, m, 1)))
        back = at + F0 + hop + F1 + B1 + hop
        events[(0, 0)] += [(back, ("B", home, m, 0)), (back + B0, ("W", home, m, 0))]
    for peer, pending in ws.items():
        blocks = sorted(t for t, key in events[peer] if key[0] == "F")
        free, placed, i = 0.0, [], 0
        for start in blocks:
            while i < len(pending) and pending[i][0] <= free + 1e-9 and free + W1 <= start + 1e-9:
                placed.append((free, pending[i][1]))
                free += W1
                i += 1
            free = max(free, start + F1 + B1)
        placed += [(free + 1e-6 * n, key) for n, (_, key) in enumerate(pending[i:])]
        events[peer] += placed
    return {w: [key for _, key in sorted(seq)] for w, seq in events.items()}


def test_the_hand_pattern_is_a_valid_plan_near_the_bound():
    job = JobSpec.parse(LONE)
    ops = retime(job, hand_pattern(job)).ops
    assert validate(job, FAILED, ops) == []
    period = replay(job, ops).iteration_ms
    # 44 trips at six per 58.74 ms (no slot ever waits), the collectives and a few ms of fill.
    assert 44 / 6 * 58.74 + 30.4 < period < 44 / 6 * 58.74 + 30.4 + 12.0
    assert period <= 1.02 * lower_bound(job, FAILED).value_ms


def test_trip_schedules_reach_the_hand_pattern():
    job = JobSpec.parse(LONE)
    hand = replay(job, retime(job, hand_pattern(job)).ops).iteration_ms
    found = [(replay(job, ops).iteration_ms, name)
             for ops, name in trip_candidates(job, FAILED, lower_bound(job, FAILED).value_ms)]
    assert len(found) == 6  # one per cadence, each valid
    assert min(found)[0] <= hand + 1e-6


def test_the_planner_keeps_a_trip_schedule_here():
    job = JobSpec.parse(LONE)
    hand = replay(job, retime(job, hand_pattern(job)).ops).iteration_ms
    result = plan(job, list(FAILED), time_limit_s=2.0)
    assert validate(job, result.failed, result.ops) == []
    assert result.iteration_ms <= hand + 1e-6


def test_only_where_a_stage_is_left_to_one_worker():
    job = JobSpec.parse(LONE)
    assert lone_survivor_stages(job, [(1, 0)]) == [0]
    assert lone_survivor_stages(job, [(0, 1)]) == [1]
    assert lone_survivor_stages(job, []) == []
    three = JobSpec.parse({**LONE, "pipelines": 3})
    assert lone_survivor_stages(three, [(1, 0)]) == []
    assert lone_survivor_stages(three, [(1, 0), (2, 0), (0, 1)]) == [0]
    assert list(trip_candidates(three, ((1, 0),), 100.0)) == []
    assert list(trip_candidates(job, (), 100.0)) == []
    big = JobSpec.parse({**LONE, "microbatches": TRIPS_MAX_OPS // 12 + 1})
    assert big.op_count > TRIPS_MAX_OPS
    assert list(trip_candidates(big, FAILED, 100.0)) == []
    assert trips_apply(job, FAILED) and not trips_apply(big, FAILED) and not trips_apply(job, ())
    assert not trips_apply(three, ((1, 0),)) and trips_apply(three, ((1, 0), (2, 0)))


@st.composite
def lone_cases(draw):
    """A job of two or more pipelines, one stage left to a single worker, any other failures."""
    job = draw(jobs().filter(lambda j: j.pipelines > 1))
    lone = draw(st.integers(0, job.stages - 1))
    keep = draw(st.integers(0, job.pipelines - 1))
    failed = [(p, lone) for p in range(job.pipelines) if p != keep]
    for s in range(job.stages):
        if s != lone:
            dead = draw(st.sets(st.integers(0, job.pipelines - 1), max_size=job.pipelines - 1))
            failed += [(p, s) for p in sorted(dead)]
    return job, tuple(failed), draw(st.sampled_from([0.0, 0.5, 1.0, 3.0]))


@SETTINGS
@given(lone_cases())
def test_every_trip_schedule_is_valid(case):
    """Rules 1-6 on any job (memory from one activation up, W's freeing all or part of it), every
    micro-batch at every stage once; a trip always finds memory when a worker can hold one."""
    job, failed, cadence = case
    orders = trip_orders(job, failed, cadence_ms=cadence)
    assert orders is not None
    ops = retime(job, orders).ops
    assert validate(job, failed, ops) == []
    assert math.isfinite(replay(job, ops).iteration_ms)
    computed = sum(len(seq) for seq in orders.values())
    assert computed == 3 * job.stages * job.pipelines * job.microbatches


@pytest.mark.parametrize("limit, share", [(3.9, 1.0), (7.9, 0.5), (12.0, 0.25)])
def test_the_memory_limit_holds_on_the_survivor(limit, share):
    """The lone worker's memory, tight to loose, with W's that free all or part of an activation:
    its peak never exceeds the limit (rule 6, read from the plan), and with room for more than
    one micro-batch it does hold more than one."""
    spec = {**LONE, "memory_limit_mb": limit,
            "activation_w_mb": [a * share for a in LONE["activation_mb"]]}
    job = JobSpec.parse(spec)
    for cadence in (0.0, 5.0, 10.0):
        ops = retime(job, trip_orders(job, FAILED, cadence_ms=cadence)).ops
        assert validate(job, FAILED, ops) == []
        peak = peak_memory(job, ops)[(0, 0)]
        assert peak <= limit + 1e-9
        if limit >= 2 * 3.9:
            assert peak > 3.9 + 1e-9
