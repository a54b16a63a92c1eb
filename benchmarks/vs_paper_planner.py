"""Issue 8 bar: never slower than the paper-style planner on any case, >= 5% faster on the geometric mean.

Usage:
    python benchmarks/vs_paper_planner.py [--time-limit SEC] [--seed N] [--json FILE]

The paper-style planner is evaluation/paper_planner.py (the ReCycle paper's method: 1F1B kept on
healthy workers, round-robin re-routing, CP-SAT warm-started from that construction with the
routing kept). For every scenario of ../shared/scenarios up to 8 x 8 x 24 it draws, seeded, one
single failure and for 2-4 failures one set of each pattern: spread (distinct pipelines and
stages), stage-concentrated (one stage), pipeline-concentrated (one pipeline). Both planners get the
same time limit (default: the planner's default); every plan is checked with `planner.validate`.
Prints per case both periods and paper / ours (> 1: ours is faster), then the geometric mean.
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

from evaluation.paper_planner import paper_plan  # noqa: E402
from planner.solve import DEFAULT_TIME_LIMIT_S, plan  # noqa: E402
from planner.spec import JobSpec  # noqa: E402
from planner.validate import validate  # noqa: E402

SCENARIOS = Path(__file__).resolve().parents[2] / "shared" / "scenarios"
MAX_WORKERS = 8 * 8


def failure_sets(job: JobSpec, rng: random.Random) -> list[tuple[str, list[tuple[int, int]]]]:
    D, S = job.pipelines, job.stages
    cases = [("single", [(rng.randrange(D), rng.randrange(S))])]
    for k in range(2, 5):
        if k <= min(D, S):
            pipes, stages = rng.sample(range(D), k), rng.sample(range(S), k)
            cases.append(("spread", sorted(zip(pipes, stages, strict=True))))
        if k <= D - 1:
            s = rng.randrange(S)
            cases.append(("stage", sorted((p, s) for p in rng.sample(range(D), k))))
        if k <= S:
            p = rng.randrange(D)
            cases.append(("pipeline", sorted((p, s) for s in rng.sample(range(S), k))))
    return cases


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--time-limit", type=float, default=DEFAULT_TIME_LIMIT_S,
                        help="per plan, both planners (s)")
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--scenarios", nargs="+", help="scenario file stems (default: all up to 8 x 8)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    rows = []
    print("| scenario | pattern | failed | ours ms | paper-style ms (construction) | paper / ours | "
          "our winner | wall ours / paper s |")
    print("|---|---|---|---|---|---|---|---|")
    for path in sorted(SCENARIOS.glob("*.json")):
        job = JobSpec.parse(json.loads(path.read_text()))
        if job.pipelines * job.stages > MAX_WORKERS or (args.scenarios and path.stem not in args.scenarios):
            continue
        for pattern, failed in failure_sets(job, rng):
            started = time.perf_counter()
            ours = plan(job, failed, time_limit_s=args.time_limit)  # validated inside (check=True)
            our_wall = time.perf_counter() - started
            paper = paper_plan(job, failed, time_limit_s=args.time_limit)
            bad = validate(job, ours.failed, ours.ops) + validate(job, paper.failed, paper.ops)
            ratio = paper.iteration_ms / ours.iteration_ms
            row = {"scenario": path.stem, "pattern": pattern, "failed": failed, "ours_ms": ours.iteration_ms,
                   "paper_ms": paper.iteration_ms, "paper_construction_ms": paper.constructive_ms,
                   "paper_cp_status": paper.cp_status, "ratio": ratio, "valid": not bad,
                   "our_policy": ours.stats.heuristic_policy, "our_status": ours.stats.status.value,
                   "our_wall_s": our_wall, "paper_wall_s": paper.wall_s}
            rows.append(row)
            flags = ("" if ratio >= 1 - 1e-9 else " SLOWER") + ("" if not bad else " INVALID")
            print(f"| {path.stem} | {pattern} | {failed} | {ours.iteration_ms:.2f} | "
                  f"{paper.iteration_ms:.2f} ({paper.constructive_ms:.2f}) | {ratio:.4f}{flags} | "
                  f"{ours.stats.status.value}: {ours.stats.heuristic_policy} "
                  f"| {our_wall:.1f} / {paper.wall_s:.1f} |", flush=True)
    slower = [r for r in rows if r["ratio"] < 1 - 1e-9]
    geo = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
    worst = min(rows, key=lambda r: r["ratio"])
    print(f"\n{len(rows)} cases, all valid: {all(r['valid'] for r in rows)}; slower than the paper-style "
          f"planner: {len(slower)}; worst paper / ours {worst['ratio']:.4f} ({worst['scenario']} "
          f"{worst['failed']}); geometric mean {geo:.4f} (bar: >= 1.05)")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if not slower and geo >= 1.05 else 1


if __name__ == "__main__":
    sys.exit(main())
