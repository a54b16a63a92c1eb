"""Falsify bound 11 (the first gradients queue at a narrower stage below, planner/bounds_queue.py)
on drawn jobs.

Usage:
    python benchmarks/falsify_queued_fill.py [--seed 1] [--cases 150] [--cp-seconds 2] [--draw queue|chain]

Draws small jobs with whole-millisecond times where a heavy stage holding one to three micro-batches,
with a short F, sits over a stage that lost one or two workers (so its first round trips queue
there). Compares bound 11's own value with the best of 40 random valid plans, the heuristic plan
and, where bound 11 is above the other bounds, CP-SAT's full model from the heuristic with every
bound withheld (floor 0). Prints every case where bound 11 is above the others ("raised") and a
summary; a plan below bound 11 prints BELOW and the exit status is 1
(`falsify_common.falsification_main`). `--draw chain` draws from `chain_case` instead: stage 0 over a
stage 1 that lost workers, with a stage 2 below it, where the round trip below the queue with the
others' F's or B's beside it is the term that decides.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from falsify_common import falsification_main, own_value_against_the_rest  # noqa: E402

import planner.bounds_queue as bounds_queue  # noqa: E402
from tests.planner.test_bound_queue import chain_case, drawn_case  # noqa: E402  (the suite's draws)

if __name__ == "__main__":
    measure = own_value_against_the_rest(bounds_queue, "queued_fill_bound")
    raise SystemExit(falsification_main(__doc__, {"queue": drawn_case, "chain": chain_case}, measure,
                                        seed=1, cases=150))
