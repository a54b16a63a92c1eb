"""Issue 8 bar: fault-free, never behind Zero Bubble's heuristic, strictly ahead where it is above the bound.

Usage:
    python benchmarks/vs_zero_bubble.py [--w-share 1.0 0.5] [--json FILE]

For each profile of the Zero Bubble paper (Qi et al., ICLR 2024) and each memory limit (1F1B
memory = p micro-batches of activation, and twice that), it runs ZB's heuristic
(benchmarks/zb_reference/zb_heuristic.py, their code) and our planner's fault-free plan, replays and
validates both with planner/ (same rules for both), and prints their periods and bubble rates next
to our proven bound. `--w-share` is activation_w_mb / activation_mb (what a micro-batch still holds
between B end and W end: 1.0 is the contract's default, 0.5 is ZB's own `simple_schedule` split
mem_f=2, mem_b=-1, mem_w=-1).

Bubble rate as in the ZB paper: 1 - m (F + B + W) / period (one pipeline, no all-reduce/optimizer).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.zb_reference.adapter import zb_ops  # noqa: E402
from planner.bounds import lower_bound  # noqa: E402
from planner.simulator import replay  # noqa: E402
from planner.solve import plan  # noqa: E402
from planner.spec import JobSpec  # noqa: E402
from planner.validate import validate  # noqa: E402

# name: (p, m, F, B, W, comm) in ms. The ZB paper's table of profiled T_F, T_B, T_W, T_comm (appendix),
# at the smallest m of each model, rounded as this repository already uses them: 1.5B as
# shared/scenarios/gpt-1.5b-8x8x24.json, 6.2B as benchmarks/planner_quality.py (ZB_62B), 28.3B as
# shared/scenarios/gpt-28b-16x32x96.json. 14.6B was not in the repository: 11.347/11.248/8.132/0.377
# is recalled from the same table, not re-checked against the paper (unreachable from this box).
PROFILES = {
    "1.5B": (8, 24, 18.5, 18.1, 9.3, 0.6),
    "6.2B": (8, 24, 29.7, 29.4, 19.9, 0.53),
    "14.6B": (16, 48, 11.3, 11.2, 8.1, 0.38),
    "28.3B": (32, 96, 10.4, 10.2, 7.7, 0.41),
}


def profile_job(name: str, memory_factor: int, w_share: float) -> JobSpec:
    p, m, f, b, w, comm = PROFILES[name]
    return JobSpec.parse(dict(
        pipelines=1, stages=p, microbatches=m, forward_ms=f, backward_input_ms=b, backward_weight_ms=w,
        p2p_ms=comm, allreduce_ms=0.0, optimizer_ms=0.0, activation_mb=1.0, activation_w_mb=w_share,
        memory_limit_mb=float(memory_factor * p)))


def run(name: str, factor: int, w_share: float) -> dict:
    job = profile_job(name, factor, w_share)
    c = job.costs
    work = job.microbatches * (c.forward[0] + c.backward_input[0] + c.backward_weight[0])
    started = time.perf_counter()
    zops, zb_best = zb_ops(job)
    zb_wall = time.perf_counter() - started
    zb_invalid = validate(job, (), zops)
    zb_period = replay(job, zops).iteration_ms
    started = time.perf_counter()
    ours = plan(job, ())
    our_wall = time.perf_counter() - started
    our_invalid = validate(job, (), ours.ops)
    bound = lower_bound(job, ()).value_ms
    return {
        "profile": name, "memory": f"{factor}p", "w_share": w_share, "p": job.stages, "m": job.microbatches,
        "zb_best_time_ms": zb_best, "zb_period_ms": zb_period, "zb_valid": not zb_invalid,
        "zb_violation": zb_invalid[0] if zb_invalid else "", "zb_wall_s": zb_wall,
        "our_period_ms": ours.iteration_ms, "our_valid": not our_invalid,
        "our_policy": ours.stats.heuristic_policy,
        "our_wall_s": our_wall, "bound_ms": bound,
        "zb_bubble": 1 - work / zb_period, "our_bubble": 1 - work / ours.iteration_ms,
        "bound_bubble": 1 - work / bound,
    }


def verdict(r: dict) -> str:
    if r["our_period_ms"] > r["zb_period_ms"] + 1e-6:
        return "BEHIND"
    if r["zb_period_ms"] > r["bound_ms"] + 1e-6 and r["our_period_ms"] >= r["zb_period_ms"] - 1e-6:
        return "tie above bound (not strictly ahead)"
    return "ahead" if r["our_period_ms"] < r["zb_period_ms"] - 1e-6 else "tie at bound"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--w-share", type=float, nargs="+", default=[1.0, 0.5])
    parser.add_argument("--profiles", nargs="+", default=list(PROFILES))
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    rows = []
    print("| profile | p x m | memory | W share | ZB period ms (ZB's best_time) | ZB bubble | our period ms "
          "| our bubble | bound ms | bound bubble | ours / ZB | verdict |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for w_share in args.w_share:
        for name in args.profiles:
            for factor in (1, 2):
                r = run(name, factor, w_share)
                rows.append(r)
                zb_note = "" if r["zb_valid"] else f" INVALID: {r['zb_violation'][:60]}"
                ours_note = "" if r["our_valid"] else " INVALID"
                cells = [name, f"{r['p']} x {r['m']}", r["memory"], f"{w_share:g}",
                         f"{r['zb_period_ms']:.2f} ({r['zb_best_time_ms']:.2f}){zb_note}",
                         f"{r['zb_bubble']:.4f}", f"{r['our_period_ms']:.2f}{ours_note}",
                         f"{r['our_bubble']:.4f}", f"{r['bound_ms']:.2f}", f"{r['bound_bubble']:.4f}",
                         f"{r['our_period_ms'] / r['zb_period_ms']:.4f}", verdict(r)]
                print("| " + " | ".join(cells) + " |", flush=True)
    behind = [r for r in rows if verdict(r) == "BEHIND"]
    not_ahead = [r for r in rows if verdict(r).startswith("tie above")]
    print(f"\nnever behind: {'met' if not behind else 'NOT met'} ({len(behind)} behind); strictly ahead "
          f"where ZB is above the bound: {'met' if not not_ahead else 'NOT met'} ({len(not_ahead)} ties "
          f"above the bound); all plans valid: {all(r['our_valid'] for r in rows)}")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0 if not behind else 1


if __name__ == "__main__":
    sys.exit(main())
