"""Failure sets: validation, normalization to a canonical class, and enumeration of classes.

All D pipelines are identical, so two failure sets that differ only by a relabelling of pipelines
have the same best plan up to that relabelling. A failure set is described by, for each pipeline,
the set of its failed stages; the canonical form sorts those per-pipeline sets (largest first, then
lexicographically) onto pipelines 0, 1, ... The planner solves the canonical set once and maps the
plan back through the permutation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from itertools import combinations
from math import comb

from planner.spec import JobSpec, SpecError, Worker


def parse_failure_set(job: JobSpec, failed: Iterable) -> tuple[Worker, ...]:
    """Check a failure set against the job: workers in range, every stage keeps a survivor.

    Duplicates are merged (a failure set is a set). Raises `SpecError` naming the bad worker or the
    stage that has no surviving peer.
    """
    workers: set[Worker] = set()
    for i, item in enumerate(failed):
        if (
            not isinstance(item, (list, tuple))
            or len(item) != 2
            or not all(isinstance(x, int) and not isinstance(x, bool) for x in item)
        ):
            raise SpecError(f"failed[{i}]: a worker is [pipeline, stage] (two integers), got {item!r}",
                            field="failed")
        p, s = item
        if not 0 <= p < job.pipelines:
            raise SpecError(f"failed[{i}]: pipeline {p} is out of range 0..{job.pipelines - 1}",
                            field="failed")
        if not 0 <= s < job.stages:
            raise SpecError(f"failed[{i}]: stage {s} is out of range 0..{job.stages - 1}",
                            field="failed")
        workers.add((p, s))
    per_stage = [0] * job.stages
    for _, s in workers:
        per_stage[s] += 1
    for s, count in enumerate(per_stage):
        if count >= job.pipelines:
            raise SpecError(
                f"failed: stage {s} has no surviving peer (all {job.pipelines} of its workers failed); "
                "training there needs a checkpoint restore or a rejoin",
                field="failed",
            )
    return tuple(sorted(workers))


@dataclass(frozen=True, slots=True)
class CanonicalFailure:
    """A failure set in canonical form plus the pipeline permutation that maps it back.

    `to_concrete[c]` is the concrete pipeline that canonical pipeline `c` stands for.
    """

    failed: tuple[Worker, ...]
    to_concrete: tuple[int, ...]

    @property
    def key(self) -> str:
        """A stable text key for the class (used by stores and caches)."""
        return ";".join(f"{p}:{s}" for p, s in self.failed) or "none"

    def concrete_worker(self, worker: Worker) -> Worker:
        return (self.to_concrete[worker[0]], worker[1])


def _pipeline_order_key(stages: tuple[int, ...]) -> tuple:
    return (-len(stages), stages)


def normalize(job: JobSpec, failed: Iterable) -> CanonicalFailure:
    """The canonical class of a failure set, with the permutation back to the concrete pipelines."""
    workers = parse_failure_set(job, failed)
    by_pipeline: dict[int, list[int]] = {}
    for p, s in workers:
        by_pipeline.setdefault(p, []).append(s)
    damaged = sorted(by_pipeline, key=lambda p: (_pipeline_order_key(tuple(by_pipeline[p])), p))
    healthy = [p for p in range(job.pipelines) if p not in by_pipeline]
    to_concrete = tuple(damaged + healthy)
    canonical = tuple(
        sorted((c, s) for c, p in enumerate(damaged) for s in by_pipeline[p])
    )
    return CanonicalFailure(failed=canonical, to_concrete=to_concrete)


def raw_failure_set_count(job: JobSpec, max_failures: int) -> int:
    """How many distinct failure sets of size 0..k exist before normalization."""
    n = job.pipelines * job.stages
    return sum(comb(n, k) for k in range(min(max_failures, n) + 1))


class TooManyClasses(SpecError):
    """More failure classes than the caller's cap (raised before they are allocated)."""

    def __init__(self, job: JobSpec, max_failures: int, cap: int):
        super().__init__(f"max_failures: {max_failures} gives more than {cap} failure classes for a "
                         f"{job.pipelines} x {job.stages} job; ask for fewer failures", field="max_failures")


def enumerate_failure_classes(job: JobSpec, max_failures: int,
                              max_classes: int | None = None) -> Iterator[tuple[Worker, ...]]:
    """Every canonical failure set with at most `max_failures` workers that leaves each stage a survivor.

    Yields in increasing number of failures, the empty set first. With `max_classes`, raises
    `TooManyClasses` as soon as there are more, before allocating them: each stage subset of size
    <= max_failures on one pipeline is a class of its own (D >= 2), so their count, known by
    arithmetic, is checked first; the enumeration then stops at the cap.
    """
    if max_failures < 0:
        raise SpecError("max_failures: must be >= 0", field="max_failures")
    if max_classes is not None and job.pipelines >= 2:
        at_least = 1 + sum(comb(job.stages, k) for k in range(1, min(max_failures, job.stages) + 1))
        if at_least > max_classes:
            raise TooManyClasses(job, max_failures, max_classes)
    subsets: list[tuple[int, ...]] = []
    for size in range(1, min(max_failures, job.stages) + 1):
        subsets.extend(combinations(range(job.stages), size))
    subsets.sort(key=_pipeline_order_key)

    def extend(start: int, parts: list[tuple[int, ...]], budget: int, stage_count: list[int]):
        if budget == 0 or len(parts) == job.pipelines:
            return
        for i in range(start, len(subsets)):
            part = subsets[i]
            if len(part) > budget:
                continue
            if any(stage_count[s] + 1 >= job.pipelines for s in part):
                continue
            for s in part:
                stage_count[s] += 1
            parts.append(part)
            yield tuple(parts)
            yield from extend(i, parts, budget - len(part), stage_count)
            parts.pop()
            for s in part:
                stage_count[s] -= 1

    by_size: dict[int, list[tuple[Worker, ...]]] = {0: [()]}
    count = 1
    for parts in extend(0, [], max_failures, [0] * job.stages):
        workers = tuple(sorted((c, s) for c, part in enumerate(parts) for s in part))
        by_size.setdefault(len(workers), []).append(workers)
        count += 1
        if max_classes is not None and count > max_classes:
            raise TooManyClasses(job, max_failures, max_classes)
    for size in sorted(by_size):
        yield from sorted(by_size[size])
