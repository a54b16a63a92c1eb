"""Falsify bound 9 (late round trips against the stage's span, planner/bounds_span.py) on drawn jobs.

Usage:
    python benchmarks/falsify_span_round_trips.py [--seed 1] [--cases 150] [--cp-seconds 2]

Draws small jobs with whole-millisecond times where an upstream stage lost more workers than a
stage below it heavy in F, B and W (so bound 9 applies), and compares bound 9's own value with the
best of 40 random valid plans, the heuristic plan and, where bound 9 is above the other bounds,
CP-SAT's full model from the heuristic with every bound withheld (floor 0). Prints every case where
bound 9 is above the others ("raised") and a summary; a plan below bound 9 prints BELOW and the
exit status is 1 (`falsify_common.falsification_main`).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from falsify_common import falsification_main, withheld  # noqa: E402

import planner.bounds_span as bounds_span  # noqa: E402
from planner.bounds import lower_bound  # noqa: E402
from planner.spec import JobSpec  # noqa: E402


def drawn_case(rng: random.Random) -> tuple[JobSpec, list]:
    D, S, M = rng.randint(2, 5), rng.randint(2, 4), rng.randint(1, 3)
    upstream = rng.randrange(S - 1)
    heavy = rng.randrange(upstream + 1, S)  # the stage whose span the narrow one delays

    def whole(low: int, high: int) -> list[float]:
        return [float(rng.randint(low, high) if s == heavy else rng.randint(1, 3)) for s in range(S)]
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": whole(3, 8),
            "backward_input_ms": whole(3, 8), "backward_weight_ms": whole(2, 9),
            "p2p_ms": float(rng.randint(0, 1)), "cross_pipeline_p2p_ms": float(rng.randint(0, 2)),
            "allreduce_ms": float(rng.randint(0, 4)), "optimizer_ms": float(rng.randint(0, 1)),
            "activation_mb": 2.0, "activation_w_mb": rng.choice([2.0, 1.0, 0.0]),
            "memory_limit_mb": rng.choice([2.0, 3.0, 4.0, 6.0, 100.0])}
    job = JobSpec.parse(spec)
    failed = [(p, upstream) for p in rng.sample(range(D), rng.choice([1, 1, 2][:D - 1]))]
    if rng.random() < 0.3:  # sometimes a loss further down too
        s = rng.randrange(upstream + 1, S)
        failed += [(p, s) for p in rng.sample(range(D), 1) if (p, s) not in failed]
    return job, failed


def measure(job: JobSpec, failed: list) -> tuple[float, float] | None:
    """(bound 9's own value, the other bounds), None where bound 9 does not apply."""
    span = bounds_span.span_round_trip_bound(job, failed).value_ms
    if span <= 0:
        return None
    with withheld(bounds_span, "span_round_trip_bound"):
        return span, lower_bound(job, failed).value_ms


if __name__ == "__main__":
    raise SystemExit(falsification_main(__doc__, drawn_case, measure, seed=1, cases=150))
