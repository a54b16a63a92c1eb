"""Falsify bound 4's recurrence term (bound 6's recurrence per kind of worker when a stage's
micro-batches are shared among unequal workers, planner/bounds_sharing.py) on drawn jobs.

Usage:
    python benchmarks/falsify_shared_paced.py [--seed 1] [--cases 150] [--cp-seconds 2]
        [--draw shared|priced|lone]

Draws the suite's cases where some of a stage's workers are cut from the stage below and memory is
short (`tests/planner/test_bound_shared_paced.shared_paced_case`; `--draw priced` and `--draw lone`
the draws of bounds 4's pricing and 12, which it rarely raises). Compares the full bound with the best of 40
random valid plans, the heuristic plan and, where the recurrence term raises it above the bound
without it, CP-SAT's full model from the heuristic with every bound withheld (floor 0). Prints every
case it raises ("raised") and a summary; a plan below the bound prints BELOW and the exit status is
1 (`falsify_common.falsification_main`).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from falsify_common import falsification_main, withheld  # noqa: E402

import planner.bounds_sharing as bounds_sharing  # noqa: E402
from planner.bounds import lower_bound  # noqa: E402
from tests.planner.test_bound_lone_priced import drawn_lone_case  # noqa: E402
from tests.planner.test_bound_priced_trips import drawn_priced_case  # noqa: E402
from tests.planner.test_bound_shared_paced import shared_paced_case  # noqa: E402


def measure(job, failed):
    """(the full bound, the bound with the recurrence term withheld); the per-worker caches are
    emptied around each, so that the withheld run computes its terms afresh."""
    bounds_sharing.forget()
    full = lower_bound(job, failed).value_ms
    with withheld(bounds_sharing, "paced_w_ends", lambda costs, s, n, *_: [0.0] * (n + 1),
                  bounds_sharing.forget):
        without = lower_bound(job, failed).value_ms
    return full, without


def draws(case):
    def draw(rng):
        job, failed, _ = case(rng)
        return job, failed
    return draw


if __name__ == "__main__":
    kinds = {"shared": draws(shared_paced_case), "priced": draws(drawn_priced_case),
             "lone": draws(drawn_lone_case)}
    raise SystemExit(falsification_main(__doc__, kinds, measure, seed=1, cases=150))
