"""Adapted plan vs dropping the damaged pipelines, on every failure pattern (issue 8, bar 1).

Usage:
    python benchmarks/never_behind_drop.py [--cp] [--big] [--seed N] [--json FILE]

For each scenario in ../shared/scenarios (the 16 x 32 x 96 job only with --big) it plans every
single failure (one per stage), failures concentrated in one stage (stages 0, S/2, S-1; 2-4 of
them), concentrated in one pipeline (2-4 random stages of pipeline 0, twice) and spread over
pipelines and stages (2-4, three random sets each), seeded. The drop period is priced as
`recycle bench` does: the planner's fault-free plan of one pipeline carrying ceil(D x M / D')
micro-batches. Prints per pattern the number of cases, how many are slower than dropping (the bar:
none), the smallest and the geometric mean of drop period / adapted period.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.solve import plan  # noqa: E402
from planner.spec import JobSpec  # noqa: E402
from planner.validate import validate  # noqa: E402

SCENARIOS = Path(__file__).resolve().parents[2] / "shared" / "scenarios"


def failure_sets(job: JobSpec, rng: random.Random) -> list[tuple[str, list[tuple[int, int]]]]:
    D, S = job.pipelines, job.stages
    cases = [("single", [(0, s)]) for s in range(S)]
    for s in sorted({0, S // 2, S - 1}):
        for k in range(2, min(4, D - 1) + 1):
            cases.append(("stage", [(p, s) for p in range(k)]))
    for _ in range(2):
        for k in range(2, min(4, S) + 1):
            cases.append(("pipeline", [(0, s) for s in sorted(rng.sample(range(S), k))]))
    for _ in range(3):
        for k in range(2, min(4, D - 1, S) + 1):
            pipes, stages = rng.sample(range(D), k), rng.sample(range(S), k)
            cases.append(("spread", sorted(zip(pipes, stages, strict=True))))
    return cases


def drop_period(job: JobSpec, failed, cache: dict) -> float:
    healthy = job.pipelines - len({p for p, _ in failed})
    busiest = -(-job.pipelines * job.microbatches // healthy)
    if busiest not in cache:
        single = job.model_copy(update={"pipelines": 1, "microbatches": busiest})
        cache[busiest] = plan(single, (), use_cp=False).iteration_ms
    return cache[busiest]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cp", action="store_true", help="CP-SAT on (default limit); heuristic otherwise")
    parser.add_argument("--big", action="store_true", help="include the 16 x 32 x 96 job")
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    for path in sorted(SCENARIOS.glob("*.json")):
        job = JobSpec.parse(json.loads(path.read_text()))
        if job.op_count > 60_000 and not args.big:
            continue
        rng, cache = random.Random(args.seed), {}
        for pattern, failed in failure_sets(job, rng):
            started = time.perf_counter()
            result = plan(job, failed, use_cp=args.cp)
            wall = time.perf_counter() - started
            rows.append({"job": path.stem, "pattern": pattern, "failed": failed,
                         "adapted_ms": result.iteration_ms, "drop_ms": drop_period(job, failed, cache),
                         "valid": not validate(job, failed, result.ops), "wall_s": wall,
                         "policy": result.stats.heuristic_policy})
    print("| job | pattern | cases | slower than drop | min drop/adapted | geomean drop/adapted "
          "| all valid |")
    print("|---|---|---|---|---|---|---|")
    for key in sorted({(r["job"], r["pattern"]) for r in rows}):
        group = [r for r in rows if (r["job"], r["pattern"]) == key]
        ratios = [r["drop_ms"] / r["adapted_ms"] for r in group]
        slower = sum(r["adapted_ms"] > r["drop_ms"] + 1e-6 for r in group)
        geo = math.exp(sum(map(math.log, ratios)) / len(ratios))
        print(f"| {key[0]} | {key[1]} | {len(group)} | {slower} | {min(ratios):.4f} | {geo:.4f} "
              f"| {all(r['valid'] for r in group)} |")
    worst = min(rows, key=lambda r: r["drop_ms"] / r["adapted_ms"])
    print(f"\nworst: {worst['job']} {worst['failed']}: adapted {worst['adapted_ms']:.1f} ms, drop "
          f"{worst['drop_ms']:.1f} ms ({worst['policy']}); {len(rows)} plans, "
          f"{sum(r['wall_s'] for r in rows):.1f} s planning")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if all(r["adapted_ms"] <= r["drop_ms"] + 1e-6 and r["valid"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
