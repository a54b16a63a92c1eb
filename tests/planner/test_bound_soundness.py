"""Item C: the claimed `lower_bound_ms` is falsified by no valid plan.

Small jobs with whole-millisecond times (every sum exact in floating point, so the comparisons
need no tolerance at all): random valid plans (tests/planner/random_plans.py, accepted by the
validator) and long-ish CP-SAT runs with another seed must never have a shorter replayed period
than the bound the planner claims (analytic, or CP-SAT's proof when it raised it). Derivations of
every bound: docs/notes/bounds.md.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.bounds import lower_bound
from planner.simulator import replay
from planner.solve import plan
from planner.spec import JobSpec
from planner.validate import validate
from tests.planner.random_plans import random_plan

whole = st.integers(1, 6).map(float)


@st.composite
def cases(draw, max_d=3, max_s=3, max_m=4):
    D, S, M = draw(st.integers(1, max_d)), draw(st.integers(1, max_s)), draw(st.integers(1, max_m))
    per = st.one_of(whole, st.lists(whole, min_size=S, max_size=S))
    act = 2.0
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": draw(per),
            "backward_input_ms": draw(per), "backward_weight_ms": draw(per),
            "p2p_ms": draw(st.integers(0, 2).map(float)),
            "cross_pipeline_p2p_ms": draw(st.integers(0, 3).map(float)),
            "allreduce_ms": draw(st.integers(0, 6).map(float)),
            "optimizer_ms": draw(st.integers(0, 2).map(float)),
            "activation_mb": act, "activation_w_mb": draw(st.sampled_from([0.0, 1.0, 2.0])),
            "memory_limit_mb": draw(st.sampled_from([2.0, 3.0, 4.0, 5.0, 6.0, 8.0]))}
    job = JobSpec.parse(spec)
    failed = []
    if D > 1:
        for s in range(S):
            dead = draw(st.sets(st.integers(0, D - 1), max_size=D - 1))
            failed += [(p, s) for p in sorted(dead)]
    return job, failed, draw(st.integers(0, 2**31))


def random_valid_periods(job, failed, seed, count, stay_home=lambda rng: rng.random()):
    """Replayed periods of `count` random valid plans, each checked by the validator; `stay_home(rng)`
    draws each plan's chance of serving a micro-batch on its home pipeline."""
    rng = random.Random(seed)
    periods = []
    for i in range(count):
        ops = random_plan(job, failed, rng, stay_home=stay_home(rng), w_late=rng.random())
        if ops is None:
            continue
        assert validate(job, failed, ops) == [], f"random plan {i} invalid"
        periods.append(replay(job, ops).iteration_ms)
    return periods


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases())
def test_no_random_valid_plan_beats_the_analytic_bound(case):
    job, failed, seed = case
    bound = lower_bound(job, failed).value_ms
    periods = random_valid_periods(job, failed, seed, 25)
    assert periods, "no random plan completed"
    assert min(periods) >= bound, (min(periods), bound)


@settings(max_examples=15, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(cases(max_d=2, max_s=3, max_m=3))
def test_no_plan_beats_the_claimed_bound_cp_included(case):
    """The planner's claim with CP-SAT on (its proof may raise the analytic bound), against a
    second, longer CP-SAT search with another seed and random valid plans."""
    from planner.cp import cpsat

    job, failed, seed = case
    claimed = plan(job, failed, use_cp=True, time_limit_s=2.0, seed=0)
    bound = claimed.lower_bound_ms
    assert claimed.iteration_ms >= bound
    hint = claimed.ops if not claimed.canonical.failed else None
    if hint is None:  # the CP model wants the canonical class: plan it on the canonical failure set
        canonical_failed = claimed.canonical.failed
        hint_plan = plan(job, canonical_failed, use_cp=False)
        hint, failed = hint_plan.ops, list(canonical_failed)
    period = replay(job, hint).iteration_ms
    longer = cpsat.improve(job, tuple(failed), hint, period + 1.0, 0.0, 4.0, seed=7)
    if longer.ops is not None:
        assert validate(job, failed, longer.ops) == []
        assert longer.period_ms >= bound, (longer.period_ms, bound, claimed.bound_reason)
    assert min(random_valid_periods(job, failed, seed, 25), default=bound) >= bound
