"""Random small jobs and failure sets through the full planner (CP-SAT on): validity and bounds.

Usage: python benchmarks/planner_fuzz.py [--seconds 200] [--seed 11] [--time-limit 1.5]
       [--wide | --compressed]

Draws jobs with D 1-4, S 1-4, M 1-6, random per-stage lists, optional memory limits, for half of
them (`--activation-w`) activation_w_mb below activation_mb, and 0-3 failures (sets that leave a
stage without a survivor are skipped: the planner refuses them, which the tests check). Every
plan must pass the six rules, replay to its `iteration_ms` and never beat its bound. Complements
tests/planner/test_properties.py, which runs the heuristic only.

`--wide` draws another stream (`wide_job`): D 1-7, S 1-7, M 1-16, times with three decimals and
some zeros, memory that may hold exactly one micro-batch, and failures spread, in one stage, in one
pipeline or on most workers. There every plan must also be no slower than dropping the damaged
pipelines, and each job's first plan (which also makes the job's fault-free plan) is timed: the
service stops a solve after 2 x its time limit + 30 s. `--compressed` draws jobs just above
`planner.compress.COMPRESS_MIN_OPS` (S 2-8, M S-3S, D up to ~22,000) with 1-8 failures, planned as the
compressed job; its every op (expanded) gets the same checks.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from never_behind_drop import drop_period  # noqa: E402

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


def broken(job: JobSpec, failed, result, drop_ms: float | None = None) -> str | None:
    """What is wrong with `result`, as a FAIL line (None: nothing): a rule broken, a replayed period
    other than `iteration_ms`, a period below the bound, or, given the dropping period, above it.
    A compressed plan's ops are expanded (`list`) and checked as any plan's."""
    concrete = list(result.ops)
    problems = validate(job, result.failed, concrete)
    period = replay(job, concrete).iteration_ms
    slower = drop_ms is not None and result.iteration_ms > drop_ms + 1e-6
    if problems or abs(period - result.iteration_ms) > 1e-6 or \
            result.iteration_ms < result.lower_bound_ms - 1e-6 or slower:
        drop = "" if drop_ms is None else f" drop={drop_ms}"
        return (f"FAIL job={job.model_dump_json()} failed={failed}: {problems[:3]} period={period} "
                f"reported={result.iteration_ms} bound={result.lower_bound_ms}{drop}")
    return None


def wide_job(rng: random.Random) -> JobSpec:
    """`--wide`'s jobs: odd shapes and edge values (module docstring)."""
    stages = rng.randint(1, 7)

    def per_stage(lo: float, hi: float, zero: float = 0.0):
        def one() -> float:
            return 0.0 if rng.random() < zero else round(rng.uniform(lo, hi), rng.choice([1, 3]))
        return [one() for _ in range(stages)] if rng.random() < 0.6 else one()

    spec = dict(pipelines=rng.randint(1, 7), stages=stages, microbatches=rng.randint(1, 16),
                forward_ms=per_stage(0.05, 12), backward_input_ms=per_stage(0.05, 14),
                backward_weight_ms=per_stage(0.05, 8), p2p_ms=per_stage(0, 2, 0.2),
                allreduce_ms=per_stage(0, 30, 0.2), optimizer_ms=per_stage(0, 3, 0.2),
                activation_mb=per_stage(0.1, 4, 0.1))
    if rng.random() < 0.6:
        spec["cross_pipeline_p2p_ms"] = per_stage(0, 4, 0.2)
    acts = spec["activation_mb"]
    acts = acts if isinstance(acts, list) else [acts] * stages
    if rng.random() < 0.6:
        share = rng.choice([0.0, 0.3, 0.5, 1.0])
        spec["activation_w_mb"] = [a * share for a in acts]
    if rng.random() < 0.7:
        spec["memory_limit_mb"] = max(max(acts), round(max(acts) * rng.choice(
            [1.0, rng.uniform(1, 2), rng.uniform(1, stages + 3)]), 3))
    return JobSpec.parse(spec)


def wide_failures(rng: random.Random, job: JobSpec) -> list[tuple[int, int]]:
    """Spread, one stage, one pipeline or most workers; every stage keeps a survivor."""
    D, S = job.pipelines, job.stages
    if D == 1:
        return []
    kind = rng.choice(["spread", "stage", "pipeline", "heavy"])
    if kind == "stage":
        s = rng.randrange(S)
        return sorted((p, s) for p in rng.sample(range(D), rng.randint(1, D - 1)))
    if kind == "pipeline":
        p = rng.randrange(D)
        return sorted((p, s) for s in rng.sample(range(S), rng.randint(1, S)))
    if kind == "heavy":
        return sorted((p, s) for s in range(S) for p in rng.sample(range(D), rng.randint(0, D - 1)))
    failed: list[tuple[int, int]] = []
    workers = [(p, s) for p in range(D) for s in range(S)]
    rng.shuffle(workers)
    for p, s in workers[:rng.randint(1, 4)]:
        if sum((q, s) not in failed for q in range(D)) > 1:
            failed.append((p, s))
    return sorted(failed)


def compressed_job(rng: random.Random) -> tuple[JobSpec, list[tuple[int, int]]]:
    """`--compressed`'s jobs and failure sets (module docstring)."""
    from planner.compress import COMPRESS_MIN_OPS

    S = rng.randint(2, 8)
    M = rng.randint(S, 3 * S)
    D = -(-(COMPRESS_MIN_OPS + 10_000) // (3 * S * M)) + rng.randint(0, 40)

    def per_stage(lo: float, hi: float):
        return [round(rng.uniform(lo, hi), 2) for _ in range(S)] if rng.random() < 0.6 \
            else round(rng.uniform(lo, hi), 2)

    spec = dict(pipelines=D, stages=S, microbatches=M, forward_ms=per_stage(0.5, 6),
                backward_input_ms=per_stage(0.5, 7), backward_weight_ms=per_stage(0.3, 4),
                p2p_ms=per_stage(0, 0.5), cross_pipeline_p2p_ms=per_stage(0.2, 1.5),
                allreduce_ms=per_stage(1, 30), optimizer_ms=per_stage(0, 2), activation_mb=per_stage(0.5, 2))
    acts = spec["activation_mb"] if isinstance(spec["activation_mb"], list) else [spec["activation_mb"]] * S
    if rng.random() < 0.5:
        spec["activation_w_mb"] = [round(a * 0.5, 3) for a in acts]
    if rng.random() < 0.6:
        spec["memory_limit_mb"] = round(max(acts) * rng.uniform(1.0, S + 2), 2)
    kind = rng.choice(["spread", "stage", "pipeline"])
    if kind == "stage":
        s = rng.randrange(S)
        failed = [(p, s) for p in rng.sample(range(D), rng.randint(1, 6))]
    elif kind == "pipeline":
        p = rng.randrange(D)
        failed = [(p, s) for s in rng.sample(range(S), rng.randint(1, S))]
    else:
        failed = [(rng.randrange(D), rng.randrange(S)) for _ in range(rng.randint(1, 8))]
    return JobSpec.parse(spec), sorted(set(failed))


def wide(args) -> int:
    rng = random.Random(args.seed)
    planned = 0
    first_walls: list[float] = []
    started = time.time()
    while time.time() - started < args.seconds:
        if args.compressed:
            job, failed = compressed_job(rng)
        else:
            job = wide_job(rng)
            failed = wide_failures(rng, job)
        began = time.perf_counter()
        result = plan(job, failed, time_limit_s=args.time_limit)
        first_walls.append(time.perf_counter() - began)
        damaged = len({p for p, _ in failed})
        drop = drop_period(job, failed, {}) if 0 < damaged < job.pipelines else None
        failure = broken(job, failed, result, drop)
        if failure:
            print(failure)
            return 1
        planned += 1
    first_walls.sort()
    deadline = 2 * args.time_limit + 30
    print(f"{planned} plans valid, replayed period == iteration_ms, never below the bound, never "
          f"slower than dropping; first plan of a job (fault-free plan included): median "
          f"{first_walls[len(first_walls) // 2]:.1f} s, max {first_walls[-1]:.1f} s, "
          f"{sum(w > deadline for w in first_walls)} over the service's {deadline:g} s deadline; "
          f"{time.time() - started:.0f} s")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=200.0)
    parser.add_argument("--seed", type=int, default=11)
    parser.add_argument("--time-limit", type=float, default=1.5)
    parser.add_argument("--activation-w", type=float, default=0.5,
                        help="share of jobs with activation_w_mb below activation_mb (rule 6's release "
                             "at B end); 0 draws the jobs of runs before 2026-11-24")
    parser.add_argument("--wide", action="store_true", help="the wider job stream (module docstring)")
    parser.add_argument("--compressed", action="store_true", help="jobs the planner compresses")
    args = parser.parse_args()
    if args.wide or args.compressed:
        return wide(args)
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
        failure = broken(job, failed, result)
        if failure:
            print(failure)
            return 1
        planned += 1
    print(f"{planned} plans valid, replayed period == iteration_ms, never below the bound; "
          f"{refused} failure sets refused (a stage without a survivor); {time.time() - started:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
