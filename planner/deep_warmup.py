"""Fault-free candidates with a deeper warm-up: ZB-H2-shaped sweeps for memory above 1F1B's.

The sweep policies of `planner.candidates` vary the warm-up as `S - s + slack`: the same slope as
1F1B, so extra memory only lets every stage run a few more forwards ahead. Zero Bubble's schedules
for twice 1F1B's memory (ZB-H2 and the ZB-2p heuristic) use a slope of two instead: stage s runs
about 2 (S - s) forwards before its first B, so the B's of the last stages arrive while stage 0
still has forwards to run, and the W's that are deferred fill the drain at the end. With the
contract's rule 6 letting B free part of a micro-batch (`activation_w_mb` < `activation_mb`), that is
what closes the bubble (measured: Zero Bubble 6.2B profile, p=8, m=24, memory 2p, W share 0.5:
1F1B-slope sweeps 2116.6 ms at best, this family 1901.3 ms, ZB's heuristic 1901.3 ms; see
benchmarks/vs_zero_bubble.py).

The family: depth_s = round(slope x (S - s)) + offset, capped by memory and made non-increasing down
the pipeline (a stage that waits for more forwards than its predecessor sends would deadlock), then
one B and one F in turn; W's placed by `sweep_schedule` (in the gaps before each input, forced in
only to free memory). Only for jobs without failures: failure plans inherit it through the
fault-free template (`insertion_orders`).
"""

from __future__ import annotations

from collections.abc import Iterator

from planner.routing import Routing
from planner.spec import JobSpec
from planner.sweep import SweepPolicy, sweep_schedule
from planner.timeline import Key, Op, Orders

SLOPES = (1.5, 2.0)
OFFSETS = (-2, -1, 0, 1)
OVERRUNS = (0.0, 0.5, 1.0)


def warmup_depths(job: JobSpec, slope: float, offset: int) -> list[int]:
    """Forwards each stage runs before its first B (at least 1, at most M and what memory holds)."""
    S, M = job.stages, job.microbatches
    depths: list[int] = []
    for s in range(S):
        want = max(1, int(round(slope * (S - s))) + offset)
        depths.append(max(1, min(want, M, job.costs.fits(s, M), *(depths[-1:] or [M]))))
    return depths


def deep_warmup_orders(job: JobSpec, depths: list[int]) -> Orders:
    """Every worker's F/B order (the planner's `Orders`): `depths[s]` forwards, then one B and one
    F in turn, its own micro-batches in index order."""
    S, M = job.stages, job.microbatches
    orders: Orders = {}
    for p in range(job.pipelines):
        for s in range(S):
            k = depths[s]
            seq: list[Key] = [("F", p, m, s) for m in range(k)]
            for j in range(M):
                seq.append(("B", p, j, s))
                if k + j < M:
                    seq.append(("F", p, k + j, s))
            orders[(p, s)] = seq
    return orders


def deep_warmup_candidates(job: JobSpec, routing: Routing) -> Iterator[tuple[list[Op] | None, str]]:
    """(schedule or None, name) for each distinct warm-up of the family and each W overrun."""
    if routing.failed:
        return
    seen: set[tuple[int, ...]] = set()
    for slope in SLOPES:
        for offset in OFFSETS:
            depths = warmup_depths(job, slope, offset)
            if tuple(depths) in seen:
                continue
            seen.add(tuple(depths))
            orders = deep_warmup_orders(job, depths)
            for overrun in OVERRUNS:
                ops = sweep_schedule(job, routing, SweepPolicy(w_overrun=overrun), orders)
                yield ops, f"deep-warmup(slope={slope:g},offset={offset},overrun={overrun:g})"
