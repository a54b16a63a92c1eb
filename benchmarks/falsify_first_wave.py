"""Falsify bound 7 (the first wave, planner/bounds_wave.py) on drawn jobs it applies to.

Usage:
    python benchmarks/falsify_first_wave.py [--seed 2] [--cases 150] [--cp-seconds 2]

Draws small jobs with whole-millisecond times where one stage runs one micro-batch at a time
(2 MB activations, limit 2-3 MB) and the next stage lost workers, keeps those where the bound
applies, and compares `lower_bound` with the best of 40 random valid plans, the heuristic plan and,
where bound 7 raised the bound, CP-SAT's full model from the heuristic with the bound withheld
(floor 0). Prints every case it raised and a summary; a plan below the bound prints BELOW
(`falsify_common.falsification_main`).
"""

from __future__ import annotations

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from falsify_common import falsification_main, withheld  # noqa: E402

import planner.bounds_wave as bounds_wave  # noqa: E402
from planner.bounds import lower_bound  # noqa: E402
from planner.spec import JobSpec  # noqa: E402


def drawn_case(rng: random.Random) -> tuple[JobSpec, list]:
    D, S, M = rng.randint(2, 5), rng.randint(2, 3), rng.randint(1, 3)
    def whole() -> list[float]:
        return [float(rng.randint(1, 6)) for _ in range(S)]
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": whole(),
            "backward_input_ms": whole(), "backward_weight_ms": whole(),
            "p2p_ms": float(rng.randint(0, 2)), "cross_pipeline_p2p_ms": float(rng.randint(0, 3)),
            "allreduce_ms": float(rng.randint(0, 6)), "optimizer_ms": float(rng.randint(0, 2)),
            "activation_mb": 2.0, "activation_w_mb": rng.choice([1.5, 2.0, 1.0, 0.5]),
            "memory_limit_mb": rng.choice([2.0, 3.0])}
    job = JobSpec.parse(spec)
    s = rng.randrange(S - 1)
    failed = [(p, s + 1) for p in rng.sample(range(D), rng.randint(1, D - 1))]
    if rng.random() < 0.3:
        failed += [(p, s) for p in rng.sample(range(D), 1) if (p, s + 1) not in failed]
    return job, failed


def measure(job: JobSpec, failed: list) -> tuple[float, float] | None:
    """(`lower_bound`, the same with bound 7 withheld), None where bound 7 does not apply."""
    if bounds_wave.wave_bound(job, failed).value_ms <= 0:
        return None
    bound = lower_bound(job, failed).value_ms
    with withheld(bounds_wave, "wave_bound"):
        return bound, lower_bound(job, failed).value_ms


if __name__ == "__main__":
    raise SystemExit(falsification_main(__doc__, drawn_case, measure, seed=2, cases=150))
