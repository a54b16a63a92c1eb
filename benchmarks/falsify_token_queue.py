"""Falsify bound 13 (memory tokens queued at a stage below, planner/bounds_tokens.py) on drawn jobs.

Usage:
    python benchmarks/falsify_token_queue.py [--seed 1] [--cases 300] [--cp-seconds 2]

Draws small jobs with whole-millisecond times (`tests.planner.test_bound_tokens.token_case`: one to
three pipelines of three to five stages, a cheap stage 0 holding one to three micro-batches, a
heavier serving stage, mostly the last, at times with a failure there). Compares bound 13's own
value with the best of 40 random valid plans, the heuristic plan and, where bound 13 is above the
other bounds, CP-SAT's full model from the heuristic with every bound withheld (floor 0). Prints
every case where bound 13 is above the others ("raised") and a summary; a plan below bound 13 prints
BELOW and the exit status is 1 (`falsify_common.falsification_main`).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from falsify_common import falsification_main, own_value_against_the_rest  # noqa: E402

import planner.bounds_tokens as bounds_tokens  # noqa: E402
from tests.planner.test_bound_tokens import token_case  # noqa: E402  (the suite's draw)

if __name__ == "__main__":
    measure = own_value_against_the_rest(bounds_tokens, "token_queue_bound")
    raise SystemExit(falsification_main(__doc__, token_case, measure, seed=1, cases=300))
