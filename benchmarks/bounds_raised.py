"""Which made-up cases (`benchmarks/gap_unseen.py`'s jobs and failure sets) a bound raises.

Usage:
    python benchmarks/bounds_raised.py [--bound late|span|wave|priced|fed|queue|lone|shared-paced|tokens]
        [--seeds 0 1 2 3 4 5] [--jobs 10] [--fault-free]

For each seed, replays gap_unseen's draw (`--jobs` jobs, three failure sets each; seed 0 was run
with 6 jobs in docs/benchmarks.md) and compares `lower_bound` with the bound withheld against the
full `lower_bound`; prints every case it raises and the count. Bounds only, no planning (seconds).
`--fault-free` adds each job's fault-free bound (the failure set `()`) to its three.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from falsify_common import withheld  # noqa: E402
from gap_unseen import failure_sets, loses_a_whole_stage, made_up_job  # noqa: E402

import planner.bounds_feed as bounds_feed  # noqa: E402
import planner.bounds_late as bounds_late  # noqa: E402
import planner.bounds_priced as bounds_priced  # noqa: E402
import planner.bounds_queue as bounds_queue  # noqa: E402
import planner.bounds_sharing as bounds_sharing  # noqa: E402
import planner.bounds_span as bounds_span  # noqa: E402
import planner.bounds_tokens as bounds_tokens  # noqa: E402
import planner.bounds_wave as bounds_wave  # noqa: E402
from planner.bounds import lower_bound  # noqa: E402
from tests.planner.test_bound_priced_trips import keeps_bound_4  # noqa: E402

BOUNDS = {"late": (bounds_late, "late_round_trip_bound", None),
          "fed": (bounds_feed, "fed_fill_bound", None),
          "queue": (bounds_queue, "queued_fill_bound", None),
          "span": (bounds_span, "span_round_trip_bound", None),
          "wave": (bounds_wave, "wave_bound", None),
          "priced": (bounds_sharing, "priced_trips", keeps_bound_4),
          "lone": (bounds_priced, "priced_round_trip_bound", None),
          "tokens": (bounds_tokens, "token_queue_bound", None),
          "shared-paced": (bounds_sharing, "paced_w_ends", lambda costs, s, n, *_: [0.0] * (n + 1))}
FORGETS = {"shared-paced": bounds_sharing.forget}
"""Bounds whose per-worker terms are cached across calls: their caches are emptied before each
`lower_bound`, so that the withheld run computes them afresh."""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bound", choices=sorted(BOUNDS), default="late")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--jobs", type=int, default=10)
    parser.add_argument("--fault-free", action="store_true", help="count each job's fault-free bound too")
    args = parser.parse_args()
    module, name, nothing = BOUNDS[args.bound]
    cases = raised = 0
    for seed in args.seeds:
        rng = random.Random(seed)
        for j in range(6 if seed == 0 else args.jobs):
            job = made_up_job(rng)
            sets = failure_sets(job, rng, 3)
            for pattern, failed in ([("fault-free", [])] if args.fault_free else []) + sets:
                if loses_a_whole_stage(job, failed):
                    continue  # gap_unseen skips these too
                cases += 1
                forget = FORGETS.get(args.bound)
                if forget is not None:
                    forget()  # a value cached by an earlier case's withheld run
                with_it = lower_bound(job, failed)
                with withheld(module, name, nothing, forget):
                    without = lower_bound(job, failed).value_ms
                if with_it.value_ms > without + 1e-9:
                    raised += 1
                    print(f"seed {seed} #{j} {job.pipelines}x{job.stages}x{job.microbatches} {pattern} "
                          f"{failed}: {without:.2f} -> {with_it.value_ms:.2f} ({with_it.reason})")
    print(f"{args.bound}: raised {raised} of {cases} bounds")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
