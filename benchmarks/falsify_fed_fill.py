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

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from falsify_common import falsification_main, own_value_against_the_rest  # noqa: E402

import planner.bounds_feed as bounds_feed  # noqa: E402
from tests.planner.test_bound_feed import drawn_case  # noqa: E402  (one draw for the suite and this script)

if __name__ == "__main__":
    measure = own_value_against_the_rest(bounds_feed, "fed_fill_bound")
    raise SystemExit(falsification_main(__doc__, drawn_case, measure, seed=1, cases=150))
