"""What the bound falsification scripts share: the best plan found for a drawn job, a bound withheld
from `lower_bound` to see what the others claim without it, and the drawing loop with its command
line (`falsification_main`)."""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.bounds import Bound, lower_bound  # noqa: E402
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
def withheld(module: ModuleType, name: str, nothing: Callable | None = None,
             forget: Callable[[], None] | None = None) -> Iterator[None]:
    """`module.name` (a bound function that `lower_bound` imports when called) claims nothing: it
    returns `nothing`'s value instead (default: a zero Bound). `forget` (e.g.
    `bounds_sharing.forget`) empties the caches of terms built on it, before and after, so that
    neither the withheld run nor the next one reads the other's values."""
    kept = getattr(module, name)
    if forget is not None:
        forget()
    setattr(module, name, nothing or (lambda *_, **__: Bound(0.0, "")))
    try:
        yield
    finally:
        setattr(module, name, kept)
        if forget is not None:
            forget()


Draw = Callable[[random.Random], tuple[JobSpec, list]]
Measure = Callable[[JobSpec, list], "tuple[float, float] | None"]


def own_value_against_the_rest(module: ModuleType, name: str) -> Measure:
    """A `Measure` for the bound `module.name`: (its own value, `lower_bound` with it withheld),
    None where it claims nothing."""
    def measure(job: JobSpec, failed: list) -> tuple[float, float] | None:
        own = getattr(module, name)(job, failed).value_ms
        if own <= 0:
            return None
        with withheld(module, name):
            return own, lower_bound(job, failed).value_ms

    return measure


def falsification_main(doc: str, draw: Draw | dict[str, Draw], measure: Measure, seed: int,
                        cases: int) -> int:
    """The command line of a falsification script. Draws cases with `draw(rng)` until `--cases` of
    them have `measure(job, failed)` = (the value claimed, the bound without the one falsified), None
    where that bound does not apply. Each is checked against the best of `RANDOM_PLANS` random valid
    plans and the heuristic plan, and, where the claimed value is above the rest, against CP-SAT's
    full model from the heuristic with its floor at 0. Prints those cases and every plan below the
    claimed value (BELOW); the exit status is 1 if there is one. Where `draw` names several draws,
    `--draw` picks one (the first by default)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--seed", type=int, default=seed)
    parser.add_argument("--cases", type=int, default=cases)
    parser.add_argument("--cp-seconds", type=float, default=2.0)
    if isinstance(draw, dict):
        parser.add_argument("--draw", choices=list(draw), default=next(iter(draw)))
    args = parser.parse_args()
    if isinstance(draw, dict):
        draw = draw[args.draw]
    rng = random.Random(args.seed)
    done = raised = below = 0
    started = time.perf_counter()
    while done < args.cases:
        job, failed = draw(rng)
        measured = measure(job, failed)
        if measured is None:
            continue
        claimed, others = measured
        done += 1
        best, heuristic = best_random_or_heuristic(job, failed, rng)
        if claimed > others + 1e-9:
            raised += 1
            cp_best, status = cp_sat_from(job, heuristic, args.cp_seconds)
            best = min(best, cp_best)
            print(f"raised {others:.2f} -> {claimed:.2f}, best plan {best:.2f} ({status})", flush=True)
        if best < claimed - 1e-9:
            below += 1
            print(f"BELOW {job.filled()} {failed}: plan {best} < bound {claimed}", flush=True)
    print(f"{done} cases, raised in {raised}, plans below the bound: {below}; "
          f"{time.perf_counter() - started:.0f} s")
    return 1 if below else 0
