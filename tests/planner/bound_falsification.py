"""What the bound test files falsifying one bound on drawn cases share: the first drawn cases the
bound raises, and the two searches that must never get below it (random valid plans, CP-SAT's full
model floored at 0)."""

from __future__ import annotations

import random
from collections.abc import Callable

import pytest

from planner.bounds import lower_bound
from planner.solve import plan
from planner.spec import JobSpec
from tests.planner.test_bound_soundness import random_valid_periods

Draw = Callable[[random.Random], tuple[JobSpec, list, int]]


def withholding(module, name: str, stand_in: Callable, monkeypatch,
                forget: Callable[[], None] = lambda: None) -> Callable[[JobSpec, list], bool]:
    """Whether a case's full bound is above its bound with `module.name` replaced by `stand_in`
    (the bound under test withheld). `forget` empties caches that would keep the withheld term
    (called around each `lower_bound`)."""
    def raised(job: JobSpec, failed: list) -> bool:
        forget()
        full = lower_bound(job, failed).value_ms
        forget()
        with monkeypatch.context() as patched:
            patched.setattr(module, name, stand_in)
            without = lower_bound(job, failed).value_ms
        forget()
        return full > without + 1e-9

    return raised


def count_raised(draw: Draw, raised: Callable[[JobSpec, list], bool], seeds: int) -> int:
    """How many of the drawn cases of seeds 0 .. seeds - 1 the bound under test raises (the
    falsification means something only if that is many)."""
    return sum(raised(*draw(random.Random(seed))[:2]) for seed in range(seeds))


def raised_cases(draw: Draw, raised: Callable[[JobSpec, list], bool], count: int,
                 tries: int) -> list[tuple[int, JobSpec, list, int]]:
    """(seed, job, failed, plans' seed) of the first `count` of `tries` drawn cases whose bound
    `raised` says the bound under test raises; fails the test when there are fewer."""
    found = []
    for seed in range(tries):
        job, failed, plans_seed = draw(random.Random(seed))
        if raised(job, failed):
            found.append((seed, job, failed, plans_seed))
            if len(found) == count:
                return found
    pytest.fail(f"only {len(found)} of {tries} drawn cases raised")


def no_random_plan_below(cases: list[tuple[int, JobSpec, list, int]]) -> None:
    """40 random valid plans per case, each staying on its home pipeline with one of several
    chances, none below the case's bound."""
    for seed, job, failed, plans_seed in cases:
        bound = lower_bound(job, failed).value_ms
        periods = random_valid_periods(job, failed, plans_seed, 40,
                                       stay_home=lambda rng: rng.choice([0.5, 0.7, 0.85, 1.0]))
        assert periods
        assert min(periods) >= bound, (seed, min(periods), bound)


def cp_sat_not_below(cases: list[tuple[int, JobSpec, list, int]]) -> None:
    """CP-SAT's full model (free routing) given 3 s from the heuristic plan, with its floor at 0
    rather than at the bound: neither below the case's bound."""
    from planner.cp import cpsat

    for seed, job, failed, _ in cases:
        start = plan(job, failed, use_cp=False)
        found = cpsat.improve(job, tuple(start.failed), start.ops, start.iteration_ms + 1.0, 0.0, 3.0, seed=3)
        best = start.iteration_ms if found.ops is None else min(start.iteration_ms, found.period_ms)
        assert best >= lower_bound(job, failed).value_ms, (seed, best)
