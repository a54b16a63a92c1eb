"""Falsify bound 4's priced round trips and memory windows (bounds.md section 4) on drawn small jobs.

Usage:
    python benchmarks/falsify_priced_trips.py [--seed 1] [--cases 100] [--cp-seconds 2]

Draws small jobs with whole-millisecond times, a heavy stage below a stage that lost workers (the
suite's `drawn_priced_case`), and compares the full `lower_bound` with the best of 40 random valid
plans, the heuristic plan and, where the priced trips raise the bound (against `lower_bound` with
them withheld), CP-SAT's full model from the heuristic with its floor at 0. A plan below the bound
prints BELOW and the exit status is 1 (`falsify_common.falsification_main`).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from falsify_common import falsification_main, withheld  # noqa: E402

import planner.bounds_sharing as bounds_sharing  # noqa: E402
from planner.bounds import lower_bound  # noqa: E402
from planner.spec import JobSpec  # noqa: E402
from tests.planner.test_bound_priced_trips import drawn_priced_case, keeps_bound_4  # noqa: E402


def drawn_case(rng: random.Random) -> tuple[JobSpec, list]:
    """The test suite's draw (`drawn_priced_case`): a failure at stage s, a heavier stage s + 1."""
    job, failed, _ = drawn_priced_case(rng)
    return job, failed


def measure(job: JobSpec, failed: list) -> tuple[float, float]:
    """(`lower_bound`, the same with the priced trips withheld: each stage keeps bound 4's own value)."""
    bound = lower_bound(job, failed).value_ms
    with withheld(bounds_sharing, "priced_trips", keeps_bound_4):
        return bound, lower_bound(job, failed).value_ms


if __name__ == "__main__":
    raise SystemExit(falsification_main(__doc__, drawn_case, measure, seed=1, cases=100))
