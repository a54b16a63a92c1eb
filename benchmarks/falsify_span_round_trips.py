"""Falsify bound 9 (late round trips against the stage's span, planner/bounds_span.py) on drawn jobs.

Usage:
    python benchmarks/falsify_span_round_trips.py [--seed 1] [--cases 150] [--cp-seconds 2]

Draws small jobs with whole-millisecond times where an upstream stage lost more workers than a
stage below it heavy in F, B and W (bound 8's draw with a heavier W, so bound 9 applies), and
compares bound 9's own value with the best of 40 random valid plans, the heuristic plan and, where
bound 9 is above the other bounds, CP-SAT's full model from the heuristic with every bound withheld
(floor 0). Prints every case where bound 9 is above the others ("raised") and a summary; a plan
below bound 9 prints BELOW and the exit status is 1 (`falsify_common.falsification_main`).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from falsify_common import falsification_main, own_value_against_the_rest  # noqa: E402
from falsify_late_round_trips import drawn_case as late_case  # noqa: E402

import planner.bounds_span as bounds_span  # noqa: E402
from planner.spec import JobSpec  # noqa: E402


def drawn_case(rng: random.Random) -> tuple[JobSpec, list]:
    """Bound 8's drawn jobs with the heavy stage's W drawn from 2-9 ms, so that its span binds."""
    return late_case(rng, heavy_w=(2, 9))


if __name__ == "__main__":
    measure = own_value_against_the_rest(bounds_span, "span_round_trip_bound")
    raise SystemExit(falsification_main(__doc__, drawn_case, measure, seed=1, cases=150))
