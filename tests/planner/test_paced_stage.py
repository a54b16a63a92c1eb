"""A stage paced by memory (`Policy.paced_stage`; issue 8, the 1.03 bar).

Where a stage's busiest worker holds fewer micro-batches than keep it busy for a round trip, its
forwards wait for memory, and bound 6 (docs/notes/bounds.md section 7) says how soon each can start:
one slot's W end after its round trip. Input gradients at stage 0 feed nothing upstream, so running
a ready one before a forward that fits (or before the W that makes it fit) only delays that slot's
next round trip. At a deeper bottleneck stage (a stage left to few survivors) the same holds for the
stage's own pace: its gradients feed stage s - 1, whose round trips it sets anyway.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import planner.candidates as candidates
from planner.bounds import lower_bound
from planner.candidates import heuristic_policies, memory_paces_first_stage, memory_short_stages
from planner.heuristic import Policy, list_schedule
from planner.precedence import needs
from planner.routing import balanced_routing
from planner.simulator import replay
from planner.spec import JobSpec
from planner.validate import validate
from tests.planner.random_plans import max_cycle_mean
from tests.planner.test_bound_recurrence import SEVEN_BY_FOUR
from tests.planner.test_properties import SETTINGS, jobs_with_failures

policies = st.builds(
    Policy,
    w_tolerance=st.sampled_from([None, 0.0, 0.5]),
    feed_bottleneck=st.booleans(),
    routing_rotation=st.integers(0, 2),
    paced_stage=st.just(0),
)
# Validity of paced list schedules: tests/planner/test_tail_forwards.py draws the flag too.


def memory_at(job: JobSpec, mine: list, t: float) -> tuple[float, bool]:
    """A stage-s worker's memory just before `t` (rule 6: activation from F start to B end,
    activation_w from B end to W end) and whether a W of it could start at `t` (its B has ended,
    the W has not started)."""
    s = mine[0].worker[1]
    a, aw = job.costs.activation[s], job.costs.activation_w[s]
    start = {(op.kind, op.microbatch): op for op in mine}
    held, w_ready = 0.0, False
    for (kind, mb), f in start.items():
        if kind != "F":
            continue
        b, w = start[("B", mb)], start[("W", mb)]
        if f.start_ms < t - 1e-9 and b.end_ms > t + 1e-9:
            held += a
        elif b.end_ms <= t + 1e-9 and w.end_ms > t + 1e-9:
            held += aw
            w_ready = w_ready or w.start_ms >= t - 1e-9
    return held, w_ready


def arrivals(job: JobSpec, ops: list, stage: int) -> dict:
    """When each micro-batch's forward input reaches its stage-`stage` worker (rule 3: the F at
    stage - 1 ends, then the hop, same- or cross-pipeline); 0 at stage 0."""
    forwards = {(op.microbatch, op.worker[1]): op for op in ops if op.kind == "F"}
    if stage == 0:
        return {mb: 0.0 for mb, s in forwards if s == 0}
    hop = needs(job.costs, job.stages)[("F", stage)]
    out = {}
    for (mb, s), op in forwards.items():
        if s == stage:
            before = forwards[(mb, stage - 1)]
            same = before.worker[0] == op.worker[0]
            out[mb] = before.end_ms + (hop.same_ms if same else hop.cross_ms)
    return out


@settings(SETTINGS, max_examples=120)
@given(jobs_with_failures(), policies.map(lambda p: replace(p, ahead_slack=None)), st.data())
def test_no_input_gradient_runs_at_the_paced_stage_while_a_forward_could(case, policy, data):
    """The rule, read off the schedule (memory-only forward cap, so only memory holds a forward
    back): when a worker of the paced stage starts a B while a forward of it has arrived and not
    started, that forward did not fit, and no W it could have run instead would have made it fit."""
    job, failed = case
    s = data.draw(st.integers(0, job.stages - 1), label="paced_stage")
    policy = replace(policy, paced_stage=s)
    ops = list_schedule(job, balanced_routing(job, tuple(failed), policy.routing_rotation), policy)
    costs = job.costs
    limit = costs.memory_limit_mb + 1e-9
    arrived = arrivals(job, ops, s)
    for worker in {op.worker for op in ops if op.worker[1] == s}:
        mine = [op for op in ops if op.worker == worker and op.kind in "FBW"]
        forwards = [op for op in mine if op.kind == "F"]
        for b in (op for op in mine if op.kind == "B"):
            if not any(arrived[f.microbatch] <= b.start_ms + 1e-9 < f.start_ms for f in forwards):
                continue  # no forward waiting
            held, w_ready = memory_at(job, mine, b.start_ms)
            assert held + costs.activation[s] > limit, (worker, b)
            assert not (w_ready and held - costs.activation_w[s] + costs.activation[s] <= limit), (worker, b)


def test_paced_beats_the_whole_grid_on_the_seven_by_four():
    """Made-up 7 x 4 x 18 with three stage-0 workers dead: 32 micro-batches on a stage-0 worker
    that holds 3, whose round trip (34.52 ms with its W) is longer than 3 x (F + B + W) = 29.4.
    Side by side on the same routings, the paced variant of a grid policy is shorter than every
    grid policy."""
    job = JobSpec.parse(SEVEN_BY_FOUR)
    failed = ((0, 0), (1, 0), (2, 0))
    assert memory_paces_first_stage(job, failed)
    routings = {rot: balanced_routing(job, failed, rot) for rot in (0, 1)}
    grid = heuristic_policies(job)
    unpaced = min(replay(job, list_schedule(job, routings[p.routing_rotation], p)).iteration_ms for p in grid)
    paced = min(replay(job, list_schedule(job, routings[p.routing_rotation],
                                          replace(p, paced_stage=0))).iteration_ms for p in grid[:6])
    assert paced < unpaced - 5.0, (paced, unpaced)


def test_not_paced_where_memory_keeps_stage_zero_busy():
    """The same job with memory for 9 micro-batches at stage 0 (9 x 9.8 > 34.52): not paced; and
    without failures 18 per worker still exceed 3 held, so the 11 MB job is paced fault-free too,
    but the candidates only try it under failures."""
    job = JobSpec.parse({**SEVEN_BY_FOUR, "memory_limit_mb": 30.0})
    assert not memory_paces_first_stage(job, ((0, 0), (1, 0), (2, 0)))
    assert memory_paces_first_stage(JobSpec.parse(SEVEN_BY_FOUR), ())


def grid_side_by_side(job: JobSpec, routing, stage: int) -> tuple[float, float]:
    """On one routing: the best replayed period of the grid's rotation-0 policies as they are, and
    of the first `PACED_LIST_POLICIES` of them paced at `stage` (what `best_heuristic` tries)."""
    grid = [p for p in heuristic_policies(job) if p.routing_rotation == 0]
    unpaced = min(replay(job, list_schedule(job, routing, p)).iteration_ms for p in grid)
    paced = min(replay(job, list_schedule(job, routing, replace(p, paced_stage=stage))).iteration_ms
                for p in grid[:candidates.PACED_LIST_POLICIES])
    return unpaced, paced


# Stage 1 left to one worker: F = B = W = 1 ms everywhere but stage 2's B (2 ms), no hops, no
# collectives; every worker holds two micro-batches from F start to W end (activation_w = activation).
TWO_BY_THREE = {
    "pipelines": 2, "stages": 3, "microbatches": 3, "forward_ms": [1, 1, 1],
    "backward_input_ms": [1, 1, 2], "backward_weight_ms": [1, 1, 1], "p2p_ms": 0,
    "cross_pipeline_p2p_ms": 0, "allreduce_ms": 0, "optimizer_ms": 0,
    "activation_mb": [1, 1, 1], "activation_w_mb": [1, 1, 1], "memory_limit_mb": 2}


def test_hand_worked_lone_survivor_reaches_the_bound_paced():
    """(1, 1) dead: (0, 1) runs all six micro-batches, two at a time. Its F's start (from its first
    op) at 0 and 1; a third fits only once a slot's W has ended: the first micro-batch's B may
    start at 0 + F + (stage 2's F + B) = 4, so the third F starts at >= 4 + B + W = 6, and each
    later F needs one more B, W and F of the one worker: the sixth at >= 6 + 3 x 3 = 15, its B
    ends >= 15 + 5 = 20 (bound 6). Stage 0's F before and its B and W after: the period is at least
    1 + 20 + 1 + 1 = 23, which the paced schedule reaches (replay and Karp's cycle mean). B first,
    (0, 1) runs the second micro-batch's B (ready at 6) before the first one's W, so the third F
    waits until 8: no policy of the grid gets below 24 that way."""
    job = JobSpec.parse(TWO_BY_THREE)
    failed = ((1, 1),)
    routing = balanced_routing(job, failed)
    assert lower_bound(job, failed).value_ms == pytest.approx(23.0, abs=1e-9)
    assert memory_short_stages(job, routing) == [0, 1]  # stage 1 the bottleneck, both short
    unpaced, _ = grid_side_by_side(job, routing, stage=1)
    assert unpaced >= 24.0 - 1e-9
    ops = list_schedule(job, routing, Policy(ahead_slack=None, paced_stage=1))
    assert validate(job, failed, ops) == []
    assert replay(job, ops).iteration_ms == pytest.approx(23.0, abs=1e-9)
    assert max_cycle_mean(job, ops) == pytest.approx(23.0, abs=1e-9)


# Made-up 4 x 5 x 24 (`benchmarks/gap_unseen.py --seed 54`, job #8) with stage 1 left to one worker:
# 96 micro-batches on it at 11 ms of work each, five held at once (activation_w = activation).
FOUR_BY_FIVE = {
    "pipelines": 4, "stages": 5, "microbatches": 24, "forward_ms": [2.8, 4.4, 6.7, 4.7, 6.5],
    "backward_input_ms": [3.1, 4.4, 7.6, 5.4, 7.1], "backward_weight_ms": [1.0, 2.2, 2.3, 2.0, 4.1],
    "p2p_ms": 0.43, "cross_pipeline_p2p_ms": 2.4, "allreduce_ms": 23.0, "optimizer_ms": 4.2,
    "activation_mb": [2.0, 3.7, 3.4, 1.2, 2.6], "activation_w_mb": [2.0, 3.7, 3.4, 1.2, 2.6],
    "memory_limit_mb": 18.5}
FOUR_BY_FIVE_DEAD = ((0, 1), (1, 1), (2, 1))
FOUR_BY_FIVE_BOUND = 1125.92  # bound 2 through stage 1: work, forced fill and drain


def test_the_lone_survivor_paced_against_the_whole_grid():
    """Side by side on the same routing: every grid policy B-first is at least 1.08 of the bound
    (the survivor's first B's run before the W's that free its slots, so the next five round trips
    start late, and its steady state idles ~7%); paced, the first nine come within 1.02."""
    job = JobSpec.parse(FOUR_BY_FIVE)
    routing = balanced_routing(job, FOUR_BY_FIVE_DEAD)
    assert lower_bound(job, FOUR_BY_FIVE_DEAD).value_ms == pytest.approx(FOUR_BY_FIVE_BOUND, abs=0.01)
    assert memory_short_stages(job, routing) == [0, 1]  # stage 1 the bottleneck, both short
    unpaced, paced = grid_side_by_side(job, routing, stage=1)
    assert unpaced >= 1.08 * FOUR_BY_FIVE_BOUND, unpaced
    assert paced <= 1.02 * FOUR_BY_FIVE_BOUND, paced


def test_the_search_tries_the_paced_bottleneck(monkeypatch):
    """`best_heuristic` keeps a schedule paced at stage 1 within 1.02 of the bound; without the
    paced variants (`PACED_LIST_POLICIES` = 0) its best is above 1.06 (1.069: 1203.55 ms; above
    1.07 before the routing search swapped at stages no moved swap changes)."""
    job = JobSpec.parse(FOUR_BY_FIVE)
    ops, period, name = candidates.best_heuristic(job, FOUR_BY_FIVE_DEAD, FOUR_BY_FIVE_BOUND)
    assert "paced=1" in name and period <= 1.02 * FOUR_BY_FIVE_BOUND, (name, period)
    monkeypatch.setattr(candidates, "PACED_LIST_POLICIES", 0)
    _, period, name = candidates.best_heuristic(job, FOUR_BY_FIVE_DEAD, FOUR_BY_FIVE_BOUND)
    assert period > 1.06 * FOUR_BY_FIVE_BOUND, (name, period)


# Made-up 3 x 8 x 24 (`benchmarks/gap_unseen.py --seed 51`, job #0) with stage 0 left to one worker:
# 72 micro-batches on it, eight held at once (activation_w = activation).
THREE_BY_EIGHT = {
    "pipelines": 3, "stages": 8, "microbatches": 24,
    "forward_ms": [6.4, 4.0, 9.9, 8.7, 4.0, 8.9, 6.4, 5.7],
    "backward_input_ms": [5.9, 4.1, 9.0, 9.3, 4.5, 8.8, 6.2, 5.8],
    "backward_weight_ms": [5.5, 3.6, 7.5, 7.3, 1.3, 8.6, 2.7, 1.8], "p2p_ms": 0.15,
    "cross_pipeline_p2p_ms": 1.21, "allreduce_ms": 32.6, "optimizer_ms": 3.8,
    "activation_mb": [3.1, 2.6, 2.0, 3.0, 2.2, 1.8, 3.1, 1.0],
    "activation_w_mb": [3.1, 2.6, 2.0, 3.0, 2.2, 1.8, 3.1, 1.0], "memory_limit_mb": 24.8}


def test_stage_zero_paced_where_its_slots_would_keep_it_busy():
    """Eight slots x 17.8 ms of work is more than a slot's round trip, so `memory_paces_first_stage`
    says no (the spaced starts are not tried), but 72 micro-batches through eight slots are still
    paced by memory: the grid B-first is >= 1.02 of bound 6 (1388.2, the slots' recurrence), the
    first nine policies paced at stage 0 within 1.002."""
    job = JobSpec.parse(THREE_BY_EIGHT)
    failed = ((0, 0), (1, 0))
    routing = balanced_routing(job, failed)
    bound = lower_bound(job, failed).value_ms
    assert bound == pytest.approx(1388.2, abs=0.01)
    assert not memory_paces_first_stage(job, failed)
    assert memory_short_stages(job, routing) == [0]  # stage 0 is also the bottleneck
    unpaced, paced = grid_side_by_side(job, routing, stage=0)
    assert unpaced >= 1.02 * bound, unpaced
    assert paced <= 1.002 * bound, paced
