"""Falsify bound 8 (late round trips, planner/bounds_late.py) on drawn jobs it applies to.

Usage:
    python benchmarks/falsify_late_round_trips.py [--seed 1] [--cases 150] [--cp-seconds 2]

Draws small jobs with whole-millisecond times where an upstream stage lost more workers than a
heavier stage below it (so bound 8 applies), and compares bound 8's own value with the best of 40 random
valid plans, the heuristic plan and, where bound 8 is above the other bounds, CP-SAT's full model
from the heuristic with every bound withheld (floor 0). Prints every case where bound 8 is above
the others ("raised") and a summary; a plan below bound 8 prints BELOW and the exit status is 1
(`falsify_common.falsification_main`).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from falsify_common import falsification_main, own_value_against_the_rest  # noqa: E402

import planner.bounds_late as bounds_late  # noqa: E402
from planner.spec import JobSpec  # noqa: E402


def drawn_case(rng: random.Random, heavy_w: tuple[int, int] = (3, 8)) -> tuple[JobSpec, list]:
    """A job whose upstream stage lost one or two workers above a heavier stage; `heavy_w`: the
    range of that stage's W (bound 9's script draws it heavier)."""
    D, S, M = rng.randint(2, 5), rng.randint(2, 4), rng.randint(1, 3)

    upstream = rng.randrange(S - 1)
    heavy = rng.randrange(upstream + 1, S)  # the stage whose round trips the narrow one delays

    def whole(low: int = 3, high: int = 8) -> list[float]:
        return [float(rng.randint(low, high) if s == heavy else rng.randint(1, 4)) for s in range(S)]
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": whole(),
            "backward_input_ms": whole(), "backward_weight_ms": whole(*heavy_w),
            "p2p_ms": float(rng.randint(0, 2)), "cross_pipeline_p2p_ms": float(rng.randint(0, 3)),
            "allreduce_ms": float(rng.randint(0, 6)), "optimizer_ms": float(rng.randint(0, 2)),
            "activation_mb": 2.0, "activation_w_mb": rng.choice([2.0, 1.0, 0.0]),
            "memory_limit_mb": rng.choice([2.0, 3.0, 4.0, 6.0, 100.0])}
    job = JobSpec.parse(spec)
    failed = [(p, upstream) for p in rng.sample(range(D), rng.choice([1, 1, 2][:D - 1]))]
    if rng.random() < 0.3:  # sometimes a loss further down too
        s = rng.randrange(upstream + 1, S)
        failed += [(p, s) for p in rng.sample(range(D), 1) if (p, s) not in failed]
    return job, failed


if __name__ == "__main__":
    measure = own_value_against_the_rest(bounds_late, "late_round_trip_bound")
    raise SystemExit(falsification_main(__doc__, drawn_case, measure, seed=1, cases=150))
