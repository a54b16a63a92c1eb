"""The quick plan (`planner.quick`): a coordinator's first answer to a failure nobody precomputed.

Its candidates are ones the full search tries too, so the full heuristic search can never be slower
than the quick plan; and the quick plan must satisfy the contract like any other plan: checked with
the validator and with Karp's maximum cycle mean (tests/planner/random_plans.py), a second method
for the period than the replay that produced it.
"""

from __future__ import annotations

import pytest
from hypothesis import given

from planner.quick import QUICK_POLICY_PREFIX, quick_plan
from planner.solve import plan
from planner.validate import validate
from tests.planner.random_plans import max_cycle_mean
from tests.planner.test_properties import SETTINGS, jobs_with_failures


@SETTINGS
@given(jobs_with_failures())
def test_quick_plan_is_valid_and_never_beats_the_full_search(case):
    job, failed = case
    quick = quick_plan(job, failed)
    assert validate(job, quick.failed, quick.ops) == []
    assert sorted(quick.failed) == sorted(set(failed))
    assert not any(op.worker in set(failed) for op in quick.ops)
    assert max_cycle_mean(job, quick.ops) == pytest.approx(quick.iteration_ms, abs=1e-6)
    assert quick.iteration_ms >= quick.lower_bound_ms - 1e-6
    assert quick.stats.heuristic_policy.startswith(QUICK_POLICY_PREFIX)
    full = plan(job, failed, use_cp=False, time_limit_s=1e6)  # unlimited: the whole search runs
    assert full.iteration_ms <= quick.iteration_ms + 1e-6


def test_stage_and_pipeline_concentrated_failures_get_valid_quick_plans(make_job):
    job = make_job(pipelines=4, stages=3, microbatches=6)
    for failed in ([(0, 1), (1, 1), (2, 1)],       # three of four workers of one stage
                   [(2, 0), (2, 1), (2, 2)],       # one whole pipeline
                   [(0, 0), (1, 2), (3, 1)]):      # spread
        quick = quick_plan(job, failed)
        assert validate(job, quick.failed, quick.ops) == [], failed
        served = sorted(op.microbatch for op in quick.ops if op.kind == "F" and op.worker[1] == 1)
        # Rule 1 counted here: every micro-batch of every pipeline runs F once at stage 1.
        assert served == sorted((p, m) for p in range(4) for m in range(6)), failed
