"""Every job in shared/scenarios plans (heuristic only) and the plan passes the validator."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from planner.solve import plan
from planner.spec import JobSpec
from planner.validate import validate

SCENARIOS = sorted((Path(__file__).resolve().parents[3] / "shared" / "scenarios").glob("*.json"))
if not SCENARIOS:  # a missing fixture is an error, never a silent skip
    raise RuntimeError("../shared/scenarios/*.json not found beside the repository: the scenario tests "
                       "need the project's shared/ folder")


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_scenario_plans_with_and_without_failures(path):
    job = JobSpec.parse(json.loads(path.read_text()))
    failed = [(0, job.stages // 2), (1, 0)]
    result = plan(job, failed, use_cp=False)
    assert validate(job, result.failed, result.ops) == []
    assert result.lower_bound_ms - 1e-6 <= result.iteration_ms
    # The first call solved the fault-free plan with half its 10 s limit; asking with 5 s reuses it.
    fault_free = plan(job, [], time_limit_s=5.0, use_cp=False)
    assert validate(job, (), fault_free.ops) == []
    assert fault_free.iteration_ms == pytest.approx(result.fault_free_iteration_ms)
    assert fault_free.iteration_ms <= result.iteration_ms + 1e-6
