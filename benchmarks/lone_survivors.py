"""The made-up cases where a stage is left to one worker, planned side by side (issue 8, 1.03 bar).

Usage:
    python benchmarks/lone_survivors.py --seeds 0 1 2 3 4 5 34 ... 74 --json after.jsonl
                                        [--root PATH]   (plan with the planner of another checkout,
                                                         e.g. a `git worktree` of an older commit)
                                        [--time-limit 10] [--max-ops 600]
    python benchmarks/lone_survivors.py --compare before.jsonl after.jsonl

Draws the jobs and failure sets of `benchmarks/gap_unseen.py --jobs 10 --sets 3 --seed N` (`--jobs
6` for seed 0) and plans every case whose failure set leaves some stage with one alive worker on a
job of at most `--max-ops` F/B/W ops (where `planner.trips` adds its candidates; the gate is
written out here so that an older checkout plans the same cases). One JSON line per case: period,
bound, fault-free period, ratio to max(fault-free, bound), validity, wall, winner. `--compare`
prints the cases whose ratio differs, the bar's tally on each side and the geometric mean of
after / before. Run the two sides at once (one core each) so that they share the machine's load.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path


def gated(job, failed, max_ops: int) -> bool:
    dead = set(failed)
    lone = any(sum((p, s) not in dead for p in range(job.pipelines)) == 1 for s in range(job.stages))
    return job.pipelines > 1 and lone and job.op_count <= max_ops


def run(args: argparse.Namespace) -> None:
    root = Path(args.root).resolve() if args.root else Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root))
    sys.path.insert(0, str(root / "benchmarks"))
    from gap_unseen import failure_sets, made_up_job

    from planner.fault_free import fault_free_plan
    from planner.solve import plan
    from planner.validate import validate

    with open(args.json, "w") as out:
        for seed in args.seeds:
            rng = random.Random(seed)
            for j in range(6 if seed == 0 else 10):
                job = made_up_job(rng)
                sets = failure_sets(job, rng, 3)
                ff = None
                for pattern, failed in sets:
                    if not gated(job, failed, args.max_ops):
                        continue
                    ff = ff if ff is not None else fault_free_plan(job).iteration_ms
                    started = time.perf_counter()
                    result = plan(job, failed, time_limit_s=args.time_limit)
                    shape = f"{job.pipelines}x{job.stages}x{job.microbatches}"
                    row = {"case": f"{seed}:{j}:{pattern}", "shape": shape, "failed": failed,
                           "period": result.iteration_ms, "bound": result.lower_bound_ms,
                           "ff": ff, "ratio": result.iteration_ms / max(ff, result.lower_bound_ms),
                           "valid": not validate(job, result.failed, result.ops),
                           "wall_s": time.perf_counter() - started, "winner": result.stats.heuristic_policy}
                    out.write(json.dumps(row) + "\n")
                    out.flush()
                    print(f"{row['case']} {row['shape']} {row['period']:.1f} {row['ratio']:.3f} "
                          f"{row['winner']}", flush=True)


def compare(before_path: str, after_path: str) -> None:
    load = lambda path: {row["case"]: row for row in map(json.loads, Path(path).read_text().splitlines())}  # noqa: E731
    before, after = load(before_path), load(after_path)
    common = [case for case in before if case in after]
    print("case | shape | before | after | ratio before | ratio after | after's winner")
    for case in common:
        b, a = before[case], after[case]
        if abs(a["ratio"] - b["ratio"]) > 5e-4:
            print(f"{case} | {a.get('shape', '')} | {b['period']:.1f} | {a['period']:.1f} | "
                  f"{b['ratio']:.3f} | {a['ratio']:.3f} | {a['winner']}")
    within = lambda rows: sum(row["ratio"] <= 1.03 + 1e-9 for row in rows)  # noqa: E731
    geo = math.exp(sum(math.log(after[c]["period"] / before[c]["period"]) for c in common) / len(common))
    print(f"{len(common)} cases; within 1.03: before {within(before[c] for c in common)}, after "
          f"{within(after[c] for c in common)}; invalid after: {sum(not after[c]['valid'] for c in common)}; "
          f"geometric mean after / before {geo:.4f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--json", default="lone_survivors.jsonl")
    parser.add_argument("--root", help="checkout whose planner to use (default: this one)")
    parser.add_argument("--time-limit", type=float, default=10.0)
    parser.add_argument("--max-ops", type=int, default=600)
    parser.add_argument("--compare", nargs=2, metavar=("BEFORE", "AFTER"))
    args = parser.parse_args()
    if args.compare:
        compare(*args.compare)
    else:
        run(args)


if __name__ == "__main__":
    main()
