"""CP-SAT's portfolio against the wall limit: the planner's solver parameters beside CP-SAT's defaults.

Usage:
    python benchmarks/cp_wall_limit.py --seeds 82 83 84 85 [--time-limit 10] [--json FILE]

For every made-up case of `gap_unseen.py --jobs 10 --sets 3 --seed N` whose solve builds the full
CP model (`planner.cp.cpsat.full_model_fits`), plans it twice in turn, on one box:
`default` with CP-SAT's own portfolio (`default_lp` as the full-problem thread, the feasibility
pump on) and `planner` with `cpsat.WALL_LIMITED_PARAMETERS`. Each CP-SAT call's wall is recorded
against the limit it was handed (`overrun` = wall - limit), and each plan's period, ratio to
max(fault-free, bound) and wall. Prints one row per case and the summary: longest plan, largest
CP-SAT overrun, geometric mean of the periods (planner / default) and the 1.03 count of each side.
The default portfolio's LP set-up ignores the wall limit, which is what this measures.
"""

from __future__ import annotations

import argparse
import inspect
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from gap_unseen import loses_a_whole_stage  # noqa: E402
from lone_survivors import made_up_cases  # noqa: E402

from planner.cp import cpsat  # noqa: E402
from planner.cp.cpsat import full_model_fits  # noqa: E402
from planner.fault_free import fault_free_plan  # noqa: E402
from planner.solve import plan  # noqa: E402
from planner.validate import validate  # noqa: E402

PLANNER = dict(cpsat.WALL_LIMITED_PARAMETERS)
SIDES = (("default", {}), ("planner", PLANNER))


def timed_improve(calls: list[tuple[float, float]]):
    """`cpsat.improve` wrapped to record (limit handed in, wall) of each call."""
    improve = cpsat.improve
    signature = inspect.signature(improve)

    def wrapped(*args, **kwargs):
        # Bound by name, so the record does not depend on how `planner.solve` passes the limit.
        limit_s = signature.bind(*args, **kwargs).arguments["time_limit_s"]
        started = time.perf_counter()
        result = improve(*args, **kwargs)
        calls.append((limit_s, time.perf_counter() - started))
        return result

    return wrapped


def run_side(job, failed, params: dict, time_limit_s: float) -> dict:
    cpsat.WALL_LIMITED_PARAMETERS = params
    calls: list[tuple[float, float]] = []
    original = cpsat.improve
    cpsat.improve = timed_improve(calls)
    try:
        started = time.perf_counter()
        result = plan(job, failed, time_limit_s=time_limit_s)
        wall = time.perf_counter() - started
    finally:
        cpsat.improve = original
    if validate(job, result.failed, result.ops):
        raise SystemExit(f"INVALID plan for {job.pipelines}x{job.stages}x{job.microbatches} {failed}")
    reference = max(result.fault_free_iteration_ms, result.lower_bound_ms)
    return {"period": result.iteration_ms, "ratio": result.iteration_ms / reference, "wall_s": wall,
            "overrun_s": max((w - limit for limit, w in calls), default=0.0),
            "cp_status": result.stats.cp_status}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, nargs="+", required=True)
    parser.add_argument("--time-limit", type=float, default=10.0, help="per plan (s)")
    parser.add_argument("--json", type=Path, help="write the rows here")
    args = parser.parse_args()
    rows = []
    print("case | shape | failed | period default / planner | wall s | CP-SAT overrun s")
    for seed, j, job, sets in made_up_cases(args.seeds):
        fault_free_plan(job)  # once per job, outside the limit (as planner.solve.plan does)
        for pattern, failed in sets:
            if loses_a_whole_stage(job, failed) or not full_model_fits(job, failed):
                continue
            shape = f"{job.pipelines}x{job.stages}x{job.microbatches}"
            row = {"case": f"{seed}#{j} {pattern}", "shape": shape, "failed": failed}
            for name, params in SIDES:
                row[name] = run_side(job, failed, params, args.time_limit)
            rows.append(row)
            d, p = row["default"], row["planner"]
            print(f"{row['case']} | {row['shape']} | {failed} | {d['period']:.2f} / {p['period']:.2f} | "
                  f"{d['wall_s']:.1f} / {p['wall_s']:.1f} | {d['overrun_s']:.2f} / {p['overrun_s']:.2f}",
                  flush=True)
    cpsat.WALL_LIMITED_PARAMETERS = PLANNER
    if not rows:
        print("no case builds the full model")
        return 0
    print(f"\n{len(rows)} cases")
    for name, _ in SIDES:
        side = [r[name] for r in rows]
        within = sum(s["ratio"] <= 1.03 + 1e-9 for s in side)
        print(f"{name}: longest plan {max(s['wall_s'] for s in side):.1f} s, largest CP-SAT overrun "
              f"{max(s['overrun_s'] for s in side):.2f} s, plans over the limit + 0.5 s "
              f"{sum(s['wall_s'] > args.time_limit + 0.5 for s in side)}, within 1.03 {within}/{len(side)}")
    logs = [math.log(r["planner"]["period"] / r["default"]["period"]) for r in rows]
    lower = sum(r["planner"]["period"] < r["default"]["period"] - 1e-6 for r in rows)
    higher = sum(r["planner"]["period"] > r["default"]["period"] + 1e-6 for r in rows)
    print(f"planner / default: geometric mean {math.exp(sum(logs) / len(logs)):.5f}, "
          f"lower {lower}, higher {higher}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
