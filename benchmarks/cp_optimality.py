"""How close CP-SAT gets to optimal: heuristic period, CP period, bound, gap, status and time.

For each scenario and failure set (canonicalized as the planner does) this runs the planner's best
heuristic, the analytic bound, then `planner.cp.cpsat.improve` with the heuristic as warm start, and
checks the CP plan with the contract's validator and replay. Wall times depend on machine load;
CP-SAT's deterministic time is printed too. Fault-free rows plan one pipeline (the planner
replicates it D times, and the bound of D identical pipelines is the same).

    python benchmarks/cp_optimality.py                       # the 3 shared scenarios, 0-2 failures
    python benchmarks/cp_optimality.py --scenario uniform-4x4x8 --failures '[[1,0]]' '[[1,1]]' \
        --time-limit 30 --json out.json
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from planner.bounds import lower_bound  # noqa: E402
from planner.cp.cpsat import improve  # noqa: E402
from planner.failures import normalize  # noqa: E402
from planner.simulator import replay  # noqa: E402
from planner.solve import best_heuristic  # noqa: E402
from planner.spec import JobSpec, SpecError  # noqa: E402
from planner.validate import validate  # noqa: E402

SCENARIOS = ROOT.parent / "shared" / "scenarios"
DEFAULT_SCENARIOS = ("uniform-4x4x8", "gpt-1.5b-8x8x24", "gpt-28b-16x32x96")
DEFAULT_FAILURES = ("[]", "[[1,0]]", "[[1,1]]", "[[1,3]]", "[[1,0],[2,1]]")


def measure(job: JobSpec, failed_raw: list, time_limit_s: float, seed: int) -> dict:
    failed = normalize(job, failed_raw).failed
    if not failed:  # as planner.solve does: the fault-free plan is one pipeline replicated D times
        job = job.model_copy(update={"pipelines": 1})
    started = time.perf_counter()
    hint_ops, hint_period, policy = best_heuristic(job, failed)
    heuristic_s = time.perf_counter() - started
    bound = lower_bound(job, failed).value_ms
    res = improve(job, failed, hint_ops, hint_period, bound, time_limit_s, seed)
    if res.ops is not None:
        problems = validate(job, failed, res.ops)
        if problems:
            raise SystemExit(f"INVALID CP plan for {failed_raw}: {problems[:3]}")
        period = replay(job, res.ops).iteration_ms
    else:
        period = hint_period
    best_bound = max(bound, res.bound_ms)
    if period < best_bound - 1e-6:
        raise SystemExit(f"bound {best_bound} above a valid plan's period {period} for {failed_raw}")
    return {
        "failed": failed_raw,
        "canonical": [list(w) for w in failed],
        "ops": job.op_count,
        "heuristic_ms": round(hint_period, 4),
        "heuristic_policy": str(getattr(policy, "name", policy)),
        "heuristic_s": round(heuristic_s, 3),
        "cp_ms": round(period, 4),
        "analytic_bound_ms": round(bound, 4),
        "cp_bound_ms": round(res.bound_ms, 4),
        "gap": round(max(0.0, period / best_bound - 1), 5) if best_bound > 0 else None,
        "cp_status": res.cp_status,
        "model": res.model,
        "cp_wall_s": round(res.wall_s, 2),
        "deterministic_time": round(res.deterministic_time, 3),
        "branches": res.branches,
        "conflicts": res.conflicts,
        "improved": res.ops is not None,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", nargs="*", default=list(DEFAULT_SCENARIOS),
                    help="scenario names in ../shared/scenarios (without .json) or paths")
    ap.add_argument("--failures", nargs="*", default=list(DEFAULT_FAILURES),
                    help="failure sets as JSON lists of [pipeline, stage]")
    ap.add_argument("--time-limit", type=float, default=30.0, help="CP-SAT budget per case (s)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, help="also write all rows to this file")
    args = ap.parse_args(argv)

    rows = []
    print(f"# {platform.node()} {platform.processor() or platform.machine()}, "
          f"time limit {args.time_limit} s, seed {args.seed}")
    print("| scenario | failed | heuristic ms | CP ms | bound ms | gap | CP status | model | CP wall s |"
          " det. time |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for name in args.scenario:
        path = Path(name) if name.endswith(".json") else SCENARIOS / f"{name}.json"
        job = JobSpec.parse(json.loads(path.read_text()))
        for text in args.failures:
            try:
                row = measure(job, json.loads(text), args.time_limit, args.seed)
            except SpecError as exc:
                print(f"| {path.stem} | {text} | skipped: {exc} |")
                continue
            row["scenario"] = path.stem
            rows.append(row)
            gap = "-" if row["gap"] is None else f"{100 * row['gap']:.2f}%"
            print(f"| {path.stem} | {text} | {row['heuristic_ms']} | {row['cp_ms']} | "
                  f"{max(row['analytic_bound_ms'], row['cp_bound_ms'])} | {gap} | {row['cp_status']} | "
                  f"{row['model']} | {row['cp_wall_s']} | {row['deterministic_time']} |", flush=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
