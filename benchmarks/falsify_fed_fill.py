"""Falsify bound 10 (a stage short of memory above starves the fill, planner/bounds_feed.py) on drawn
jobs.

Usage:
    python benchmarks/falsify_fed_fill.py [--seed 1] [--cases 150] [--cp-seconds 2]

Draws small jobs with whole-millisecond times where a light stage holding 2 MB per micro-batch lost
workers and feeds a stage below holding 1 MB, whose B and W are long against its F (so its workers
want many forwards before their first B, and the stage above runs out of room first). Compares
bound 10's own value with the best of 40 random valid plans, the heuristic plan and, where bound 10
is above the other bounds, CP-SAT's full model from the heuristic with every bound withheld (floor
0). Prints every case where bound 10 is above the others ("raised") and a summary; a plan below
bound 10 prints BELOW and the exit status is 1 (`falsify_common.falsification_main`).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from falsify_common import falsification_main, own_value_against_the_rest  # noqa: E402

import planner.bounds_feed as bounds_feed  # noqa: E402
from planner.spec import JobSpec  # noqa: E402


def drawn_case(rng: random.Random) -> tuple[JobSpec, list]:
    """2-3 pipelines of 2-3 stages, 2-5 micro-batches: stage `up` and those above it take 1 ms per op,
    the stage below it F 1-2, B 2-4, W 2-5, any stage further down F and B 1-4, W 1-2; 4-10 MB of
    memory; one to all but one of stage `up`'s workers dead, sometimes one more below."""
    D, S, M = rng.randint(2, 3), rng.randint(2, 3), rng.randint(2, 5)
    up = rng.randint(0, S - 2)
    fed = up + 1

    def times(low: int, high: int, low_below: int = 1, high_below: int = 4) -> list[float]:
        return [float(1 if s < fed else rng.randint(low, high) if s == fed
                      else rng.randint(low_below, high_below)) for s in range(S)]
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": times(1, 2),
            "backward_input_ms": times(2, 4), "backward_weight_ms": times(2, 5, 1, 2),
            "p2p_ms": float(rng.randint(0, 1)), "cross_pipeline_p2p_ms": float(rng.randint(0, 2)),
            "allreduce_ms": float(rng.randint(0, 2)), "optimizer_ms": float(rng.randint(0, 1)),
            "activation_mb": [2.0 if s == up else 1.0 for s in range(S)],
            "activation_w_mb": rng.choice([1.0, 0.5]), "memory_limit_mb": float(rng.choice([4, 6, 8, 10]))}
    dead = rng.sample(range(D), rng.randint(1, D - 1))
    failed = [(p, up) for p in sorted(dead)]
    if rng.random() < 0.3:
        failed.append((rng.randrange(D), rng.randint(fed, S - 1)))
    return JobSpec.parse(spec), sorted(set(failed))


if __name__ == "__main__":
    measure = own_value_against_the_rest(bounds_feed, "fed_fill_bound")
    raise SystemExit(falsification_main(__doc__, drawn_case, measure, seed=1, cases=150))
