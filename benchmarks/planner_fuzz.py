"""Random small jobs and failure sets through the full planner (CP-SAT on): validity and bounds.

Usage: python benchmarks/planner_fuzz.py [--seconds 200] [--seed 11] [--time-limit 1.5]

Draws jobs with D 1-4, S 1-4, M 1-6, random per-stage lists, optional memory limits, for half of
them (`--activation-w`) activation_w_mb below activation_mb, and 0-3 failures (sets that leave a
stage without a survivor are skipped: the planner refuses them, which the tests check). Every
plan must pass the six rules, replay to its `iteration_ms` and never beat its bound. Complements
tests/planner/test_properties.py, which runs the heuristic only.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.simulator import replay  # noqa: E402
from planner.solve import plan  # noqa: E402
from planner.spec import JobSpec, SpecError  # noqa: E402
from planner.validate import validate  # noqa: E402


def random_job(rng: random.Random, activation_w_share: float = 0.0) -> JobSpec:
    stages = rng.randint(1, 4)

    def per_stage(lo: float, hi: float):
        if rng.random() < 0.5:
            return [round(rng.uniform(lo, hi), 2) for _ in range(stages)]
        return round(rng.uniform(lo, hi), 2)

    spec = dict(pipelines=rng.randint(1, 4), stages=stages, microbatches=rng.randint(1, 6),
                forward_ms=per_stage(0.5, 5), backward_input_ms=per_stage(0.5, 5),
                backward_weight_ms=per_stage(0.5, 5), p2p_ms=per_stage(0, 1),
                cross_pipeline_p2p_ms=per_stage(0, 2) if rng.random() < 0.5 else None,
                allreduce_ms=per_stage(0, 5), optimizer_ms=per_stage(0, 2), activation_mb=per_stage(0.5, 3))
    acts = spec["activation_mb"] if isinstance(spec["activation_mb"], list) else [spec["activation_mb"]]
    if rng.random() < 0.5:
        spec["memory_limit_mb"] = round(max(acts) * rng.uniform(1, stages + 1), 2)
    # Drawn last and only when asked, so `--activation-w 0` replays the job stream of earlier runs.
    if activation_w_share > 0 and rng.random() < activation_w_share:
        spec["activation_w_mb"] = [round(a * rng.choice([0.25, 0.5, 0.75]), 2) for a in acts] \
            if len(acts) == stages else round(acts[0] * rng.choice([0.25, 0.5, 0.75]), 2)
    return JobSpec.parse(spec)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=200.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--time-limit", type=float, default=1.5)
    parser.add_argument("--activation-w", type=float, default=0.5,
                        help="share of jobs with activation_w_mb below activation_mb (rule 6's release "
                             "at B end); 0 draws the jobs of runs before 2026-11-24")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    planned = refused = 0
    started = time.time()
    while time.time() - started < args.seconds:
        job = random_job(rng, args.activation_w)
        workers = [(p, s) for p in range(job.pipelines) for s in range(job.stages)]
        failed = rng.sample(workers, rng.randint(0, min(3, len(workers) - 1)))
        try:
            result = plan(job, failed, time_limit_s=args.time_limit, use_cp=True, seed=rng.randint(0, 5))
        except SpecError:
            refused += 1
            continue
        problems = validate(job, result.failed, result.ops)
        period = replay(job, result.ops).iteration_ms
        if problems or abs(period - result.iteration_ms) > 1e-6 or \
                result.iteration_ms < result.lower_bound_ms - 1e-6:
            print(f"FAIL job={job.model_dump_json()} failed={failed}: {problems[:3]} period={period} "
                  f"reported={result.iteration_ms} bound={result.lower_bound_ms}")
            return 1
        planned += 1
    print(f"{planned} plans valid, replayed period == iteration_ms, never below the bound; "
          f"{refused} failure sets refused (a stage without a survivor); {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
