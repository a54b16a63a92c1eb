"""Stage 0 paced by memory (`Policy.paced_first_stage`; issue 8, the 1.03 bar).

Where stage 0 holds fewer micro-batches than keep it busy for a round trip, its forwards wait for
memory, and bound 6 (docs/notes/bounds.md section 7) says how soon each can start: one slot's W end
after its round trip. Input gradients at stage 0 feed nothing upstream, so running a ready one
before a forward that fits (or before the W that makes it fit) only delays that slot's next round
trip.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given
from hypothesis import strategies as st

from planner.candidates import heuristic_policies, memory_paces_first_stage
from planner.heuristic import Policy, list_schedule
from planner.routing import balanced_routing
from planner.simulator import replay
from planner.spec import JobSpec
from tests.planner.test_bound_recurrence import SEVEN_BY_FOUR
from tests.planner.test_properties import SETTINGS, jobs_with_failures

policies = st.builds(
    Policy,
    w_tolerance=st.sampled_from([None, 0.0, 0.5]),
    feed_bottleneck=st.booleans(),
    routing_rotation=st.integers(0, 2),
    paced_first_stage=st.just(True),
)
# Validity of paced list schedules: tests/planner/test_tail_forwards.py draws the flag too.


def memory_at(job: JobSpec, mine: list, t: float) -> tuple[float, bool]:
    """A stage-0 worker's memory just before `t` (rule 6: activation from F start to B end,
    activation_w from B end to W end) and whether a W of it could start at `t` (its B has ended,
    the W has not started)."""
    a, aw = job.costs.activation[0], job.costs.activation_w[0]
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


@SETTINGS
@given(jobs_with_failures(), policies.map(lambda p: replace(p, ahead_slack=None)))
def test_no_stage_zero_input_gradient_runs_while_a_forward_could(case, policy):
    """The rule, read off the schedule (memory-only forward cap, so only memory holds a forward
    back): when a stage-0 worker starts a B while it has forwards left, a forward did not fit, and
    no W it could have run instead would have made it fit."""
    job, failed = case
    ops = list_schedule(job, balanced_routing(job, tuple(failed), policy.routing_rotation), policy)
    costs = job.costs
    limit = costs.memory_limit_mb + 1e-9
    for worker in {op.worker for op in ops if op.worker[1] == 0}:
        mine = [op for op in ops if op.worker == worker and op.kind in "FBW"]
        forward_starts = sorted(op.start_ms for op in mine if op.kind == "F")
        for b in (op for op in mine if op.kind == "B"):
            if forward_starts[-1] < b.start_ms:
                continue  # no forward left
            held, w_ready = memory_at(job, mine, b.start_ms)
            assert held + costs.activation[0] > limit, (worker, b)
            assert not (w_ready and held - costs.activation_w[0] + costs.activation[0] <= limit), (worker, b)


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
                                          replace(p, paced_first_stage=True))).iteration_ms for p in grid[:6])
    assert paced < unpaced - 5.0, (paced, unpaced)


def test_not_paced_where_memory_keeps_stage_zero_busy():
    """The same job with memory for 9 micro-batches at stage 0 (9 x 9.8 > 34.52): not paced; and
    without failures 18 per worker still exceed 3 held, so the 11 MB job is paced fault-free too,
    but the candidates only try it under failures."""
    job = JobSpec.parse({**SEVEN_BY_FOUR, "memory_limit_mb": 30.0})
    assert not memory_paces_first_stage(job, ((0, 0), (1, 0), (2, 0)))
    assert memory_paces_first_stage(JobSpec.parse(SEVEN_BY_FOUR), ())
