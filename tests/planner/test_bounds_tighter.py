"""Item E: the memory-time bound and the round trip's forced idle (docs/notes/bounds.md, 3 and 2).

Each value is worked out by hand and reached by a plan, so the bound is both sound and tight here.
F = B = W = 1 ms, no hops, no all-reduce or optimizer time.
"""

from __future__ import annotations

from planner.bounds import lower_bound
from planner.solve import plan
from planner.spec import JobSpec
from planner.validate import validate

UNIT = dict(forward_ms=1.0, backward_input_ms=1.0, backward_weight_ms=1.0, p2p_ms=0.0, allreduce_ms=0.0,
            optimizer_ms=0.0, activation_mb=2.0)


def test_memory_time_one_micro_batch_at_a_time():
    """1 x 2 x 3, activation 2, activation_w 0, limit 2: stage 0 holds one micro-batch between its
    F start and B end, each such window lasts at least F + (F + B at stage 1) + B = 4 ms, so the
    three windows take 12 ms back to back, then the last W: 13 ms. The work + fill + drain bound
    says only 9 + 2 + 0 = 11 (the waits in the middle of the iteration are not fill or drain)."""
    job = JobSpec.parse({**UNIT, "pipelines": 1, "stages": 2, "microbatches": 3, "activation_w_mb": 0.0,
                         "memory_limit_mb": 2.0})
    bound = lower_bound(job, [])
    assert bound.value_ms == 13.0
    assert bound.reason.startswith("memory-time at stage 0")
    result = plan(job, [], use_cp=False)
    assert validate(job, [], result.ops) == []
    assert result.iteration_ms == 13.0


def test_memory_time_in_megabytes():
    """1 x 3 x 4, activation = activation_w = limit = 2 MB: each micro-batch fills stage 0's memory
    from its F start to its W end, at least F + (F + B) x 2 + B + W = 7 ms, one at a time: 28 ms.
    The count form (F start -> B end windows, then the last W) says 4 x 6 + 1 = 25; work + fill +
    drain 12 + 4 + 4 = 20. Memory-time counts memory against limit + 1e-6 MB (the validator's
    tolerance), so it sits a hair below 28; the one-at-a-time term of bound 4 (two activations do
    not fit even with the tolerance, so the windows are disjoint) says exactly 28, and so does the
    F-start recurrence (bound 6: each F starts after the previous micro-batch's W end)."""
    from planner.bounds_sharing import sharing_bound

    job = JobSpec.parse({**UNIT, "pipelines": 1, "stages": 3, "microbatches": 4, "activation_w_mb": 2.0,
                         "memory_limit_mb": 2.0})
    bound = lower_bound(job, [])
    assert bound.value_ms == 28.0
    assert sharing_bound(job, []).value_ms == 28.0
    job_with_room = JobSpec.parse({**job.filled(), "memory_limit_mb": 4.0})  # a + aw fits: no such term
    assert sharing_bound(job_with_room, []).value_ms < 28.0
    result = plan(job, [], use_cp=False)
    assert validate(job, [], result.ops) == []
    assert result.iteration_ms == 28.0


def test_round_trip_counts_the_middle_stages_forced_idle():
    """2 x 3 x 1, worker [0, 1] failed: [1, 1] runs both micro-batches. It cannot start before a
    stage-0 forward (1 ms after that worker starts), and its first B waits F + B at stage 2 after
    its first F: of that 2 ms, it fills 1 with its second F, so 1 ms idle. First op -> last B end
    >= 2 x (F + B) + 1 = 5; with the forward (1) and backward (1) at stage 0 and the last W there
    (1): 8 ms. Without the idle the round trip said 7. A plan reaches 8."""
    job = JobSpec.parse({**UNIT, "pipelines": 2, "stages": 3, "microbatches": 1})
    bound = lower_bound(job, [(0, 1)])
    assert bound.value_ms == 8.0
    assert bound.reason == "round trip from stage 0 to stage 1"
    result = plan(job, [(0, 1)], use_cp=False)
    assert validate(job, [(0, 1)], result.ops) == []
    assert result.iteration_ms == 8.0
