"""Plan or bound: CP-SAT's full model on a made-up job cut down to fewer micro-batches (issue 8).

Usage:
    python benchmarks/cut_down_optimum.py --seed 63 --job 1 --microbatches 6 9 12 [--time-limit 150]
                                          [--pattern stage]  (that failure set of the job)
                                          [--symmetry per_home]  (the planner's own rule)

Takes job `--job` of `benchmarks/gap_unseen.py --seed N` (the same draws), sets its micro-batches to
each value of `--microbatches`, and gives CP-SAT's full model (`planner.cp.cpsat.improve`, seed 0)
`--time-limit` seconds from the planner's plan. Without `--pattern` the plan is the fault-free plan
of one pipeline of the job (`planner.fault_free`); with it, the 10 s plan of that failure set.
When CP-SAT proves its answer optimal, the row says how far the plan and the bound each are from
the optimum: which of the two is loose on that job's profile (docs/notes/planner-issue8.md, AP).
CP-SAT orders interchangeable micro-batches across homes by default (`--symmetry across_homes`:
proofs far beyond the planner's per-home rule, docs/notes/cpsat.md).
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gap_unseen import failure_sets, made_up_job  # noqa: E402

from planner.bounds import lower_bound  # noqa: E402
from planner.cp.cpsat import improve  # noqa: E402
from planner.fault_free import fault_free_plan, single_pipeline  # noqa: E402
from planner.simulator import replay  # noqa: E402
from planner.solve import plan  # noqa: E402
from planner.spec import JobSpec  # noqa: E402


def drawn(seed: int, index: int) -> tuple[JobSpec, dict[str, list]]:
    """Job `index` of `gap_unseen.py --seed seed` and its failure sets by pattern."""
    rng = random.Random(seed)
    for _ in range(index):
        failure_sets(made_up_job(rng), rng, 3)
    job = made_up_job(rng)
    return job, {pattern: failed for pattern, failed in failure_sets(job, rng, 3)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seed", type=int, required=True, help="gap_unseen.py's --seed")
    parser.add_argument("--job", type=int, required=True, help="the job's number (#N in gap_unseen.py)")
    parser.add_argument("--microbatches", type=int, nargs="+", required=True)
    parser.add_argument("--time-limit", type=float, default=150.0, help="CP-SAT's wall limit per M (s)")
    parser.add_argument("--pattern", choices=("spread", "stage", "pipeline"),
                        help="plan this failure set of the job instead of one pipeline fault-free")
    parser.add_argument("--symmetry", choices=("across_homes", "per_home"), default="across_homes",
                        help="CP-SAT's symmetry rule (planner.cp.cpsat.improve)")
    args = parser.parse_args()
    job, sets = drawn(args.seed, args.job)
    if args.pattern is not None and args.pattern not in sets:
        parser.error(f"--pattern: job {args.job} of seed {args.seed} has no {args.pattern} set")
    failed = tuple(map(tuple, sets[args.pattern])) if args.pattern else ()
    base = single_pipeline(job) if args.pattern is None else job
    print(f"seed {args.seed} job {args.job}: {job.pipelines}x{job.stages}x{job.microbatches}, "
          f"{'one pipeline, fault-free' if args.pattern is None else f'{args.pattern} {list(failed)}'}")
    print(f"CP-SAT's symmetry rule: {args.symmetry}")
    print("M | ops | plan | CP-SAT | status | bound | plan / CP-SAT | CP-SAT / bound | CP-SAT s")
    for m in args.microbatches:
        cut = JobSpec.parse({**base.filled(), "microbatches": m})
        if args.pattern is None:
            made = fault_free_plan(cut)
            ops, period, bound = list(made.ops), made.iteration_ms, lower_bound(cut, ()).value_ms
        else:
            result = plan(cut, failed, time_limit_s=10)
            ops, period, bound = list(result.ops), result.iteration_ms, result.lower_bound_ms
        started = time.perf_counter()
        found = improve(cut, tuple(sorted(failed)), ops, period, bound, args.time_limit, 0,
                        symmetry=args.symmetry)
        wall = time.perf_counter() - started
        best = replay(cut, found.ops).iteration_ms if found.ops is not None else period
        print(f"{m} | {cut.op_count} | {period:.2f} | {best:.2f} | {found.cp_status} | {bound:.2f} | "
              f"{period / best:.4f} | {best / bound:.3f} | {wall:.1f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
