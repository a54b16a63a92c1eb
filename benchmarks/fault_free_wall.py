"""Wall time of a job's fault-free plan (made once per job, before its first failure plan).

Usage:
    python benchmarks/fault_free_wall.py [--made-up] [--large] [--jobs FILE.jsonl]

`--made-up`: the 56 made-up jobs of `gap_unseen.py` seeds 0-5 (the jobs of the 1.03 bar).
`--large`: one pipeline with uneven stages and a memory limit, 6,144-12,288 ops, where the policy
grid itself (no CP-SAT step above `cpsat.FULL_MAX_OPS`) is the cost.
`--jobs`: job specs, one JSON object per line (benchmarks/jobs/fault-free-slow-cp.jsonl: eight
fuzzed small jobs whose CP-SAT step took 18-54 s before its wall was capped at 10 s).
Each row: the job, the wall, the period, and the winning policy; then the median and the largest.
A job's first plan in the planner or the service pays this on top of its solve's time limit, and
the service stops a solve after 2 x its limit + 30 s (docs/design.md, "The time limit is the
failure solve's own").
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from gap_unseen import failure_sets, made_up_job  # noqa: E402

from planner.fault_free import CACHE_ENV, clear_memory_cache, fault_free_plan  # noqa: E402
from planner.spec import JobSpec  # noqa: E402


def made_up_jobs() -> list[tuple[str, JobSpec]]:
    jobs = []
    for seed in range(6):
        rng = random.Random(seed)
        for index in range(10 if seed else 6):
            job = made_up_job(rng)
            failure_sets(job, rng, 3)  # drawn as gap_unseen draws them, so the next job is the same
            jobs.append((f"seed {seed} #{index} {job.pipelines}x{job.stages}x{job.microbatches}", job))
    return jobs


def large_pipeline(seed: int, stages: int, microbatches: int, memory_mb: float) -> JobSpec:
    rng = random.Random(seed)

    def uneven(lo: float, hi: float) -> list[float]:
        return [round(rng.uniform(lo, hi), 2) for _ in range(stages)]

    return JobSpec.parse({
        "pipelines": 1, "stages": stages, "microbatches": microbatches, "forward_ms": uneven(1, 3),
        "backward_input_ms": uneven(1, 3), "backward_weight_ms": uneven(0.5, 2), "p2p_ms": 0.1,
        "cross_pipeline_p2p_ms": 0.4, "allreduce_ms": 5.0, "optimizer_ms": 1.0,
        "activation_mb": uneven(1, 2), "activation_w_mb": 0.5, "memory_limit_mb": memory_mb})


LARGE = [(3, 16, 128, 12.0), (4, 16, 128, 40.0), (5, 32, 128, 30.0), (6, 24, 160, 20.0)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--made-up", action="store_true")
    parser.add_argument("--large", action="store_true")
    parser.add_argument("--jobs", type=Path, help="job specs, one JSON object per line")
    args = parser.parse_args()
    os.environ.pop(CACHE_ENV, None)  # made here, never read from a disk cache
    jobs = made_up_jobs() if args.made_up or not (args.large or args.jobs) else []
    if args.jobs:
        for number, line in enumerate(args.jobs.read_text().splitlines()):
            job = JobSpec.parse(json.loads(line))
            shape = f"{job.pipelines}x{job.stages}x{job.microbatches}"
            jobs.append((f"{args.jobs.name}:{number + 1} {shape}", job))
    if args.large:
        jobs += [(f"1x{s}x{m} memory {mem:g} MB", large_pipeline(seed, s, m, mem))
                 for seed, s, m, mem in LARGE]
    walls = []
    for label, job in jobs:
        clear_memory_cache()
        started = time.perf_counter()
        made = fault_free_plan(job, cache_dir=None)
        walls.append(time.perf_counter() - started)
        print(f"{label}: {walls[-1]:.2f} s, {made.iteration_ms:.2f} ms, {made.policy}", flush=True)
    walls.sort()
    print(f"{len(walls)} jobs: median {walls[len(walls) // 2]:.2f} s, largest {walls[-1]:.2f} s, "
          f"over 10 s: {sum(w > 10 for w in walls)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
