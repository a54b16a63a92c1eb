"""The replayed period against a second method, on random valid plans: the max-plus eigenvalue of
the worker-to-worker matrix (Karp's maximum cycle mean), computed without the simulator
(tests/planner/random_plans.py). Any steady state, alternating ones included, has that period; the
simulator must report it and say it settled."""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.simulator import replay
from planner.spec import JobSpec
from planner.validate import validate
from tests.planner.random_plans import max_cycle_mean, random_plan

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow])
ints = st.integers(1, 6).map(float)


@st.composite
def jobs_and_failures(draw):
    D, S, M = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(1, 3))
    act = 2.0
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": draw(ints),
            "backward_input_ms": draw(ints), "backward_weight_ms": draw(ints),
            "p2p_ms": draw(st.integers(0, 2).map(float)), "allreduce_ms": draw(st.integers(0, 5).map(float)),
            "optimizer_ms": draw(st.integers(0, 3).map(float)), "activation_mb": act,
            "activation_w_mb": draw(st.sampled_from([0.0, 1.0, 2.0])),
            "memory_limit_mb": act * draw(st.integers(1, S + 1))}
    job = JobSpec.parse(spec)
    failed = []
    if D > 1:
        failed = [(p, s) for p in range(D) for s in range(S) if draw(st.booleans()) and p < D - 1]
    return job, failed, draw(st.integers(0, 10**6))


@SETTINGS
@given(jobs_and_failures())
def test_replay_period_is_the_max_cycle_mean(case):
    job, failed, seed = case
    ops = random_plan(job, failed, random.Random(seed))
    if ops is None:  # the random choices filled every worker's memory; try other choices
        ops = random_plan(job, failed, random.Random(seed + 1), w_late=0.0)
    assert ops is not None
    assert validate(job, failed, ops) == []
    report = replay(job, ops, iterations=60)
    assert report.converged and report.cycle >= 1
    assert report.iteration_ms == pytest.approx(max_cycle_mean(job, ops), abs=1e-6)
