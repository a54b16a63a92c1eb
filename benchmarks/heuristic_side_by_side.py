"""Every made-up case's constructive plan, from two checkouts side by side (issue 8, 1.03 bar).

Usage:
    python benchmarks/heuristic_side_by_side.py --seeds 60 61 ... 75 --json after.jsonl
                                                [--root PATH]   (the planner of another checkout,
                                                                 e.g. a `git worktree` of an older commit)
                                                [--budget 3] [--max-ops 3000]
                                                [--last-stage]  (only failure sets that hit the last stage)
    python benchmarks/lone_survivors.py --compare before.jsonl after.jsonl

Draws the jobs and failure sets of `benchmarks/gap_unseen.py --jobs 10 --sets 3 --seed N` (`--jobs
6` for seed 0) and runs `candidates.best_heuristic` on every case of a job of at most `--max-ops`
F/B/W ops, as `planner.solve` does before CP-SAT: the proven bound, the job's fault-free plan as the
insertion template, `--budget` seconds. Without CP-SAT's clock a change to the constructive search
shows alone (the routing search still stops at the budget, so run the two sides at once, one core
each). One JSON line per case, in `lone_survivors.py`'s format (its `--compare` reads them).
"""

from __future__ import annotations

import argparse
import time

from lone_survivors import made_up_cases, use_checkout, write_row


def run(args: argparse.Namespace) -> None:
    use_checkout(args.root)
    from planner.bounds import lower_bound
    from planner.candidates import best_heuristic
    from planner.fault_free import fault_free_plan
    from planner.validate import validate

    with open(args.json, "w") as out:
        for seed, j, job, sets in made_up_cases(args.seeds):
            if job.op_count > args.max_ops:
                continue
            ff = fault_free_plan(job)
            for pattern, failed in sets:
                failed = tuple(failed)
                if args.last_stage and all(s != job.stages - 1 for _, s in failed):
                    continue
                bound = lower_bound(job, failed).value_ms
                started = time.perf_counter()
                ops, period, winner = best_heuristic(job, failed, bound, args.budget, template=list(ff.ops))
                write_row(out, f"{seed}:{j}:{pattern}", job, failed, period, bound, ff.iteration_ms,
                          not validate(job, failed, ops), time.perf_counter() - started, winner)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4, 5])
    parser.add_argument("--json", default="heuristic_side_by_side.jsonl")
    parser.add_argument("--root", help="checkout whose planner to use (default: this one)")
    parser.add_argument("--budget", type=float, default=3.0, help="best_heuristic's budget_s")
    parser.add_argument("--max-ops", type=int, default=3000)
    parser.add_argument("--last-stage", action="store_true",
                        help="only failure sets with a failed worker at the last stage")
    run(parser.parse_args())


if __name__ == "__main__":
    main()
