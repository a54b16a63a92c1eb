"""Jobs at cluster scale and failure sets to sweep: how many workers fail, and where.

The GPT-3-like profile is the 28.3B Zero Bubble profile (F 10.4, B 10.2, W 7.7, comm 0.41 ms per
micro-batch per stage at 32 stages; `shared/docs/background.md`, `shared/scenarios/gpt-28b-16x32x96.json`
for the all-reduce and optimizer numbers). A job with S stages holds 32/S times the layers per stage,
so every per-stage compute, all-reduce and optimizer time is scaled by 32/S; transfer delays are per
hop and stay. Failure patterns:

- spread: distinct pipelines and stages where possible (a diagonal), else uniformly at random;
- stage: concentrated, filling stage 0 (every pipeline but one), then stage 1, ...;
- pipeline: concentrated, filling pipeline 0 (every stage), then pipeline 1, ...
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from planner.spec import JobSpec, Worker

PATTERNS = ("spread", "stage", "pipeline")
GPT3_REFERENCE = {
    "stages": 32,
    "forward_ms": 10.4,
    "backward_input_ms": 10.2,
    "backward_weight_ms": 7.7,
    "p2p_ms": 0.41,
    "cross_pipeline_p2p_ms": 0.615,
    "allreduce_ms": 45.0,
    "optimizer_ms": 6.0,
    "activation_mb": 1.0,
}
SCALE_SHAPES = {64: (4, 16, 48), 256: (8, 32, 96), 1024: (32, 32, 96), 4096: (128, 32, 96)}
"""GPUs -> (pipelines, stages, micro-batches): M = 3 S, as in the shared scenarios."""


def gpt3_job(pipelines: int, stages: int, microbatches: int) -> JobSpec:
    """The GPT-3-like profile cut into `stages` stages (per-stage times scaled by 32 / stages)."""
    ref = GPT3_REFERENCE
    factor = ref["stages"] / stages
    scaled = {k: round(ref[k] * factor, 6)
              for k in ("forward_ms", "backward_input_ms", "backward_weight_ms", "allreduce_ms",
                        "optimizer_ms")}
    return JobSpec.parse({
        "pipelines": pipelines, "stages": stages, "microbatches": microbatches, **scaled,
        "p2p_ms": ref["p2p_ms"], "cross_pipeline_p2p_ms": ref["cross_pipeline_p2p_ms"],
        "activation_mb": ref["activation_mb"],
    })


def max_failures(job: JobSpec) -> int:
    """The most workers that can fail while every stage keeps a survivor."""
    return (job.pipelines - 1) * job.stages


def failure_set(job: JobSpec, count: int, pattern: str, seed: int = 0) -> tuple[Worker, ...]:
    """`count` failed workers placed by `pattern` (see the module docstring)."""
    D, S = job.pipelines, job.stages
    if pattern not in PATTERNS:
        raise ValueError(f"pattern: expected one of {', '.join(PATTERNS)}, got {pattern!r}")
    if not 0 <= count <= max_failures(job):
        raise ValueError(f"{count} failures do not fit a {D} x {S} job with a survivor in every stage "
                         f"(at most {max_failures(job)})")
    if pattern == "stage":
        return tuple(sorted((i % (D - 1), i // (D - 1)) for i in range(count)))
    if pattern == "pipeline":
        return tuple(sorted((i // S, i % S) for i in range(count)))
    if count <= min(D, S):
        return tuple(sorted((i * D // count, i * S // count) for i in range(count)))
    rng = random.Random(seed)
    per_stage = [0] * S
    chosen: set[Worker] = set()
    workers = [(p, s) for p in range(D) for s in range(S)]
    rng.shuffle(workers)
    for p, s in workers:
        if len(chosen) == count:
            break
        if per_stage[s] < D - 1:
            chosen.add((p, s))
            per_stage[s] += 1
    return tuple(sorted(chosen))


@dataclass(frozen=True)
class SweepPoint:
    """One job and failure set of a sweep, with the labels the tables and plots use."""

    job_label: str
    job: JobSpec
    pattern: str
    failed: tuple[Worker, ...]

    @property
    def fraction(self) -> float:
        return len(self.failed) / (self.job.pipelines * self.job.stages)


def count_points(label: str, job: JobSpec, counts: list[int], patterns: list[str]) -> list[SweepPoint]:
    """Failure sets of the given sizes for each pattern (a size that does not fit is skipped)."""
    points = []
    for pattern in patterns:
        for k in counts:
            if k <= max_failures(job):
                points.append(SweepPoint(label, job, pattern, failure_set(job, k, pattern)))
    return points


def fraction_points(label: str, job: JobSpec, fractions: list[float],
                    patterns: list[str]) -> list[SweepPoint]:
    """Failure sets of round(fraction x GPUs) workers (at least one for a fraction above 0)."""
    n = job.pipelines * job.stages
    counts = sorted({max(1, round(f * n)) if f > 0 else 0 for f in fractions})
    return count_points(label, job, counts, patterns)


def run_sweep(points: list[SweepPoint], strategies: list[str], evaluators: dict, progress: bool = True
              ) -> list[dict]:
    """One row per point: every strategy's iteration time and throughput, and adaptive's ratios.

    `evaluators` maps a job label to its `Evaluator` so caches are shared across a job's points.
    """
    from tqdm import tqdm

    rows = []
    for point in tqdm(points, desc="sweep", unit="point", disable=not progress):
        ev = evaluators[point.job_label]
        job = point.job
        fault_free = ev.fault_free_ms()
        row: dict = {
            "job": point.job_label, "gpus": job.pipelines * job.stages,
            "shape": f"{job.pipelines}x{job.stages}x{job.microbatches}", "pattern": point.pattern,
            "failed": len(point.failed), "fraction": round(point.fraction, 6),
            "fault_free_ms": round(fault_free, 3), "strategies": {},
        }
        for name in strategies:
            out = ev.outcome(name, point.failed)
            row["strategies"][name] = {
                "iteration_ms": None if out.iteration_ms is None else round(out.iteration_ms, 3),
                "throughput_mb_s": round(out.throughput(job), 3),
                "vs_fault_free": (None if out.iteration_ms is None
                                  else round(fault_free / out.iteration_ms, 4)),
                "detail": out.detail,
            }
        if "adaptive" in strategies:
            mine = row["strategies"]["adaptive"]["throughput_mb_s"]
            row["adaptive_over"] = {
                name: (round(mine / v["throughput_mb_s"], 4) if v["throughput_mb_s"] else None)
                for name, v in row["strategies"].items() if name != "adaptive"
            }
        rows.append(row)
    return rows
