"""Falsify bound 4's priced round trips and memory windows (bounds.md section 4) on drawn small jobs.

Usage:
    python benchmarks/falsify_priced_trips.py [--seed 1] [--cases 100] [--cp-seconds 2]

Draws small jobs with whole-millisecond times, a heavy stage below a stage that lost workers, and
compares the full `lower_bound` with the best of 40 random valid plans, the heuristic plan and,
where the priced trips raise the bound (against `lower_bound` with them withheld), CP-SAT's full
model from the heuristic with its floor at 0. A plan below the bound prints BELOW and the exit
status is 1.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from falsify_common import best_random_or_heuristic, cp_sat_from, withheld  # noqa: E402

import planner.bounds_sharing as bounds_sharing  # noqa: E402
from planner.bounds import lower_bound  # noqa: E402
from planner.spec import JobSpec  # noqa: E402


def drawn_case(rng: random.Random) -> tuple[JobSpec, list]:
    D, S, M = rng.randint(2, 3), rng.randint(2, 3), rng.randint(2, 4)
    upstream = rng.randrange(S - 1)

    def whole(heavy: int) -> list[float]:
        return [float(rng.randint(3, 6) if s == upstream + 1 else rng.randint(1, 3)) for s in range(S)]
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": whole(1),
            "backward_input_ms": whole(1), "backward_weight_ms": whole(1),
            "p2p_ms": float(rng.randint(0, 1)), "cross_pipeline_p2p_ms": float(rng.randint(1, 4)),
            "allreduce_ms": float(rng.randint(0, 4)), "optimizer_ms": float(rng.randint(0, 2)),
            "activation_mb": 2.0, "activation_w_mb": rng.choice([2.0, 1.0, 0.0]),
            "memory_limit_mb": rng.choice([2.0, 3.0, 4.0, 5.0, 100.0])}
    job = JobSpec.parse(spec)
    failed = [(p, upstream) for p in rng.sample(range(D), rng.randint(1, D - 1))]
    return job, failed


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--cases", type=int, default=100)
    parser.add_argument("--cp-seconds", type=float, default=2.0)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    raised = below = 0
    started = time.perf_counter()
    for _ in range(args.cases):
        job, failed = drawn_case(rng)
        bound = lower_bound(job, failed).value_ms
        with withheld(bounds_sharing, "priced_trips", lambda *args: args[-1]):
            before = lower_bound(job, failed).value_ms
        best, heuristic = best_random_or_heuristic(job, failed, rng)
        if bound > before + 1e-9:
            raised += 1
            cp_best, status = cp_sat_from(job, heuristic, args.cp_seconds)
            best = min(best, cp_best)
            print(f"raised {before:.2f} -> {bound:.2f}, best plan {best:.2f} ({status})", flush=True)
        if best < bound - 1e-9:
            below += 1
            print(f"BELOW {job.filled()} {failed}: plan {best} < bound {bound}", flush=True)
    print(f"{args.cases} cases, raised in {raised}, plans below the bound: {below}; "
          f"{time.perf_counter() - started:.0f} s")
    return 1 if below else 0


if __name__ == "__main__":
    raise SystemExit(main())
