"""Shared fixtures for the planner tests: small jobs and heuristic plans of them.

Plans come from the real planner with `use_cp=False` (fast and deterministic); CP-SAT has its own
tests in test_cpsat.py. The fault-free plan's opt-in CP-SAT step (planner/fault_free.py, off by
default since v8) is held off here explicitly, whatever the environment says; test_fault_free.py
turns it on where it is the subject.
"""

from __future__ import annotations

import copy
import json
import os
from pathlib import Path

import pytest

import planner.fault_free
from planner.spec import JobSpec

os.environ[planner.fault_free.CP_ENV] = "0"  # subprocesses started by tests inherit it
planner.fault_free.CP_DETERMINISTIC_S = 0.0

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = sorted((REPO.parent / "shared" / "scenarios").glob("*.json"))

SMALL_JOB = {
    "pipelines": 3,
    "stages": 3,
    "microbatches": 4,
    "forward_ms": [2.0, 3.0, 2.5],
    "backward_input_ms": 2.0,
    "backward_weight_ms": 1.5,
    "p2p_ms": 0.5,
    "cross_pipeline_p2p_ms": 2.0,
    "allreduce_ms": 4.0,
    "optimizer_ms": 1.0,
    "activation_mb": 1.0,
}


def _make_job(**changes) -> JobSpec:
    data = {**SMALL_JOB, **changes}
    return JobSpec.parse({k: v for k, v in data.items() if v is not None})


@pytest.fixture(scope="session")
def make_job():
    """`make_job(**changes)`: SMALL_JOB with some fields changed (None removes a field)."""
    return _make_job


@pytest.fixture
def copy_ops():
    """`copy_ops(ops)`: independent copies, so a test can break a plan without touching the fixture."""
    return lambda ops: [copy.copy(op) for op in ops]


@pytest.fixture(scope="session")
def small_job() -> JobSpec:
    return _make_job()


@pytest.fixture(scope="session")
def failed_plan(small_job):
    """A plan of SMALL_JOB with worker [0, 1] failed: its micro-batches cross pipelines."""
    from planner.solve import plan

    return plan(small_job, [(0, 1)], use_cp=False)


@pytest.fixture(scope="session")
def rerouted_ops(small_job):
    """Only worker [0, 1]'s micro-batches re-routed to its peers (the planner itself may prefer to
    dissolve pipeline 0): a valid plan whose hops cross pipelines, for breaking rules on."""
    from planner.routing import balanced_routing
    from planner.solve import SWEEP_POLICIES
    from planner.sweep import sweep_schedule

    return sweep_schedule(small_job, balanced_routing(small_job, ((0, 1),)), SWEEP_POLICIES[0])


@pytest.fixture(scope="session")
def fault_free_plan(small_job):
    from planner.solve import plan

    return plan(small_job, [], use_cp=False)


@pytest.fixture(scope="session")
def repo() -> Path:
    return REPO


@pytest.fixture(scope="session")
def scenario_8x8x24() -> dict:
    return json.loads((REPO.parent / "shared" / "scenarios" / "gpt-1.5b-8x8x24.json").read_text())
