"""Anytime curves (issue 8, item 2): each scenario's planned period against the solve's time limit.

Usage:
    python benchmarks/anytime.py [--limits 1 2 5 10 30] [--scenario NAME ...] [--seed 5] [--json FILE]

For every scenario in ../shared/scenarios it draws four failure sets (seeded): one failure; two in
one stage; two in one pipeline; two spread over different pipelines and stages. It makes the job's
fault-free plan once, outside every limit (as `plan` does: it is computed once per job and reused),
then plans each set afresh at every limit, since a solve at limit T is exactly what a caller who
asks for T gets: the heuristic's share of the limit, the routing search, CP-SAT's polish, the LNS
and CP-SAT all scale with it. Every plan is re-validated against the contract's rules.

Prints one markdown table per scenario: per failure set, the period at each limit, its ratio to
max(fault-free period, lower bound) and the status, and the wall time of the longest solve.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.fault_free import fault_free_plan  # noqa: E402
from planner.solve import plan  # noqa: E402
from planner.spec import JobSpec  # noqa: E402
from planner.validate import validate  # noqa: E402

SCENARIOS = Path(__file__).resolve().parents[2] / "shared" / "scenarios"


def failure_sets(job: JobSpec, rng: random.Random) -> list[tuple[str, list[tuple[int, int]]]]:
    """(pattern, failed workers): one failure, two in a stage, two in a pipeline, two spread."""
    D, S = job.pipelines, job.stages
    sets = [("single", [(rng.randrange(D), rng.randrange(S))])]
    if D > 2:
        stage = rng.randrange(S)
        sets.append(("stage", [(p, stage) for p in sorted(rng.sample(range(D), 2))]))
    if S > 1 and D > 1:
        pipeline = rng.randrange(D)
        sets.append(("pipeline", [(pipeline, s) for s in sorted(rng.sample(range(S), 2))]))
    if D > 1 and S > 1:
        pipelines, stages = rng.sample(range(D), 2), rng.sample(range(S), 2)
        sets.append(("spread", sorted(zip(pipelines, stages, strict=True))))
    return sets


def run(job: JobSpec, failed: list[tuple[int, int]], limit: float, target_ff: float) -> dict:
    started = time.perf_counter()
    result = plan(job, failed, time_limit_s=limit)
    wall = time.perf_counter() - started
    if validate(job, result.failed, result.ops):
        raise SystemExit(f"invalid plan for {failed} at {limit} s")
    target = max(target_ff, result.lower_bound_ms)
    return {"limit_s": limit, "iteration_ms": result.iteration_ms, "bound_ms": result.lower_bound_ms,
            "ratio": result.iteration_ms / target, "status": result.stats.status.value,
            "wall_s": wall}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limits", type=float, nargs="+", default=[1.0, 2.0, 5.0, 10.0, 30.0])
    parser.add_argument("--scenario", action="append", default=[],
                        help="only scenarios whose file name contains this (repeatable)")
    parser.add_argument("--seed", type=int, default=5)
    parser.add_argument("--json", type=Path, help="also write every row as JSON")
    args = parser.parse_args()
    rows = []
    for path in sorted(SCENARIOS.glob("*.json")):
        if args.scenario and not any(name in path.name for name in args.scenario):
            continue
        job = JobSpec.parse(json.loads(path.read_text()))
        started = time.perf_counter()
        fault_free = fault_free_plan(job).iteration_ms
        made_in = time.perf_counter() - started
        rng = random.Random(f"{args.seed}:{path.name}")
        print(f"\n### {path.stem} ({job.pipelines} x {job.stages} x {job.microbatches}; fault-free "
              f"{fault_free:.1f} ms, made once in {made_in:.1f} s)\n")
        print("| failure set | " + " | ".join(f"{limit:g} s" for limit in args.limits) + " | longest solve |")
        print("|---|" + "---|" * (len(args.limits) + 1))
        for pattern, failed in failure_sets(job, rng):
            cells, longest = [], 0.0
            for limit in args.limits:
                row = run(job, failed, limit, fault_free)
                rows.append({"scenario": path.stem, "pattern": pattern, "failed": failed, **row})
                longest = max(longest, row["wall_s"])
                cells.append(f"{row['iteration_ms']:.1f} ({row['ratio']:.3f}, {row['status']})")
            print(f"| {pattern} {failed} | " + " | ".join(cells) + f" | {longest:.1f} s |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
