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


def use_checkout(root: str | None) -> None:
    """Put the planner of checkout `root` (default: this one) and its benchmarks first on the
    import path; call it before importing `planner`."""
    root_path = Path(root).resolve() if root else Path(__file__).resolve().parents[1]
    sys.path.insert(0, str(root_path))
    sys.path.insert(0, str(root_path / "benchmarks"))


def made_up_cases(seeds: list[int]):
    """(seed, job number, job, failure sets) of `gap_unseen.py --jobs 10 --sets 3 --seed N` (`--jobs
    6` for seed 0)."""
    from gap_unseen import failure_sets, made_up_job

    for seed in seeds:
        rng = random.Random(seed)
        for j in range(6 if seed == 0 else 10):
            job = made_up_job(rng)
            yield seed, j, job, failure_sets(job, rng, 3)


def write_row(out, case: str, job, failed, period: float, bound: float, ff: float, valid: bool,
              wall_s: float, winner: str) -> None:
    """One case as a JSON line of `out` (the format `compare` reads), and a line on stdout."""
    row = {"case": case, "shape": f"{job.pipelines}x{job.stages}x{job.microbatches}", "failed": failed,
           "period": period, "bound": bound, "ff": ff, "ratio": period / max(ff, bound),
           "valid": valid, "wall_s": wall_s, "winner": winner}
    out.write(json.dumps(row) + "\n")
    out.flush()
    print(f"{case} {row['shape']} {period:.1f} {row['ratio']:.3f} {winner}", flush=True)


def run(args: argparse.Namespace) -> None:
    use_checkout(args.root)
    from planner.fault_free import fault_free_plan
    from planner.solve import plan
    from planner.validate import validate

    with open(args.json, "w") as out:
        for seed, j, job, sets in made_up_cases(args.seeds):
            ff = None
            for pattern, failed in sets:
                if not gated(job, failed, args.max_ops):
                    continue
                ff = ff if ff is not None else fault_free_plan(job).iteration_ms
                started = time.perf_counter()
                result = plan(job, failed, time_limit_s=args.time_limit)
                write_row(out, f"{seed}:{j}:{pattern}", job, failed, result.iteration_ms,
                          result.lower_bound_ms, ff, not validate(job, result.failed, result.ops),
                          time.perf_counter() - started, result.stats.heuristic_policy)


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
