"""Falsify bound 12 (a lone worker's round trips priced by its own chain, planner/bounds_priced.py)
on drawn jobs.

Usage:
    python benchmarks/falsify_lone_priced.py [--seed 1] [--cases 150] [--cp-seconds 2]

Draws the suite's cases (`tests/planner/test_bound_lone_priced.drawn_lone_case`): small jobs with
whole-millisecond times where one stage is left to a single worker holding two micro-batches, over
heavier stages and a dearer cross-pipeline hop. Compares bound 12's own value with the best of 40
random valid plans, the heuristic plan and, where bound 12 is above the other bounds, CP-SAT's full
model from the heuristic with every bound withheld (floor 0). Prints every case where bound 12 is
above the others ("raised") and a summary; a plan below bound 12 prints BELOW and the exit status
is 1 (`falsify_common.falsification_main`).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from falsify_common import falsification_main, own_value_against_the_rest  # noqa: E402

import planner.bounds_priced as bounds_priced  # noqa: E402
from tests.planner.test_bound_lone_priced import drawn_lone_case  # noqa: E402  (the suite's draw)


def draw(rng):
    job, failed, _ = drawn_lone_case(rng)
    return job, failed


if __name__ == "__main__":
    measure = own_value_against_the_rest(bounds_priced, "priced_round_trip_bound")
    raise SystemExit(falsification_main(__doc__, draw, measure, seed=1, cases=150))
