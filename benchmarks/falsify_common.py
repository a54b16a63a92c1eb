"""What the bound falsification scripts share: the best plan found for a drawn job, and a bound
withheld from `lower_bound` to see what the others claim without it."""

from __future__ import annotations

import random
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.bounds import Bound  # noqa: E402
from planner.cp import cpsat  # noqa: E402
from planner.simulator import replay  # noqa: E402
from planner.solve import PlanResult, plan  # noqa: E402
from planner.spec import JobSpec  # noqa: E402
from planner.validate import validate  # noqa: E402
from tests.planner.random_plans import random_plan  # noqa: E402

RANDOM_PLANS = 40


def best_random_or_heuristic(job: JobSpec, failed: list, rng: random.Random) -> tuple[float, PlanResult]:
    """(the least period of `RANDOM_PLANS` random valid plans, each checked by the validator, and the
    heuristic plan; the heuristic plan)."""
    best = float("inf")
    for _ in range(RANDOM_PLANS):
        ops = random_plan(job, failed, rng, stay_home=rng.random(), w_late=rng.random())
        if ops is not None:
            assert not validate(job, failed, ops), "random plan invalid"
            best = min(best, replay(job, ops).iteration_ms)
    heuristic = plan(job, failed, use_cp=False)
    return min(best, heuristic.iteration_ms), heuristic


def cp_sat_from(job: JobSpec, heuristic: PlanResult, seconds: float) -> tuple[float, str]:
    """(the period CP-SAT's full model reaches from the heuristic plan with its floor at 0, not at
    the analytic bound; inf when it found nothing better, its status)."""
    cp = cpsat.improve(job, tuple(heuristic.failed), heuristic.ops, heuristic.iteration_ms, 0.0, seconds,
                       seed=1)
    return (float("inf") if cp.ops is None else replay(job, cp.ops).iteration_ms), cp.cp_status


@contextmanager
def withheld(module: ModuleType, name: str, nothing: Callable | None = None) -> Iterator[None]:
    """`module.name` (a bound function that `lower_bound` imports when called) claims nothing: it
    returns `nothing`'s value instead (default: a zero Bound)."""
    kept = getattr(module, name)
    setattr(module, name, nothing or (lambda *_: Bound(0.0, "")))
    try:
        yield
    finally:
        setattr(module, name, kept)
