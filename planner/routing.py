"""Which alive peer runs each micro-batch at each stage.

Only a failed worker's micro-batches move, and only to alive workers of the same stage (rule 1).
The extra work is spread so that every peer ends with as close to `ceil(D*M / alive)` micro-batches
as possible (the per-worker work bound is driven by the most loaded peer), and each failed worker's
micro-batches are dealt out in index order across the peers so the extra work arrives spread through
the iteration rather than in one burst.
"""

from __future__ import annotations

from planner.spec import JobSpec, Worker


class Routing:
    """`executor(home, m, s)` is the pipeline whose stage-s worker runs micro-batch (home, m)."""

    __slots__ = ("job", "failed", "_moved", "load")

    def __init__(self, job: JobSpec, failed: tuple[Worker, ...], moved: dict[tuple[int, int, int], int]):
        self.job = job
        self.failed = failed
        self._moved = moved
        self.load = [[0] * job.stages for _ in range(job.pipelines)]
        dead = set(failed)
        for p in range(job.pipelines):
            for s in range(job.stages):
                if (p, s) not in dead:
                    self.load[p][s] = job.microbatches
        for (home, _, s), q in moved.items():
            self.load[q][s] += 1
            if (home, s) not in dead:  # a dissolved pipeline's alive worker gives its work away
                self.load[home][s] -= 1

    def executor(self, home: int, m: int, s: int) -> int:
        return self._moved.get((home, m, s), home)

    @property
    def moved(self) -> dict[tuple[int, int, int], int]:
        return dict(self._moved)



def balanced_routing(job: JobSpec, failed: tuple[Worker, ...], rotate: int = 0) -> Routing:
    """Deal each failed worker's micro-batches round-robin over the least-loaded alive peers.

    `rotate` shifts which peer receives the first moved micro-batch (the heuristic tries a few).
    """
    dead = set(failed)
    moved: dict[tuple[int, int, int], int] = {}
    for s in range(job.stages):
        peers = [p for p in range(job.pipelines) if (p, s) not in dead]
        homes = [p for p in range(job.pipelines) if (p, s) in dead]
        if not homes:
            continue
        total = job.pipelines * job.microbatches
        base, extra = divmod(total, len(peers))
        # Target load per peer: the first `extra` peers (after rotation) take one more.
        order = peers[rotate % len(peers):] + peers[: rotate % len(peers)]
        quota = {p: base + (1 if i < extra else 0) - job.microbatches for i, p in enumerate(order)}
        cursor = 0
        for m in range(job.microbatches):
            for home in homes:
                for _ in range(len(order)):
                    q = order[cursor % len(order)]
                    cursor += 1
                    if quota[q] > 0:
                        break
                quota[q] -= 1
                moved[(home, m, s)] = q
    return Routing(job, tuple(sorted(failed)), moved)


def dissolving_routing(job: JobSpec, failed: tuple[Worker, ...]) -> Routing | None:
    """Every micro-batch of a damaged pipeline (one with any failed worker), at every stage, goes to
    the undamaged pipelines, balanced and dealt in index order: the plan of simply dropping the
    damaged pipelines with the global batch kept. Rule 1 allows it (any same-stage peer may serve
    any micro-batch); None when every pipeline is damaged."""
    return mixed_routing(job, failed, keep=0)  # nothing kept: the same dealing


def mixed_routing(job: JobSpec, failed: tuple[Worker, ...], keep: int) -> Routing | None:
    """Between re-routing and dissolving: each damaged pipeline keeps `keep` of its M micro-batches
    (spread over the indices) on its alive workers and sends those to the undamaged pipelines only
    at its failed stages; its other micro-batches are dissolved (every stage, undamaged pipelines).
    `keep = 0` is `dissolving_routing`; the undamaged pipelines share every moved micro-batch of a
    stage, balanced, dealt in index order. None when every pipeline is damaged."""
    dead = set(failed)
    damaged = sorted({p for p, _ in failed})
    healthy = [p for p in range(job.pipelines) if p not in damaged]
    if not damaged or not healthy:
        return None
    M = job.microbatches
    kept = {m for m in range(M) if (m * keep) // M != ((m + 1) * keep) // M}  # `keep` of them, spread
    moved: dict[tuple[int, int, int], int] = {}
    for s in range(job.stages):
        tasks = [(home, m) for m in range(M) for home in damaged if (home, s) in dead or m not in kept]
        base, extra = divmod(len(tasks), len(healthy))
        quota = {p: base + (1 if i < extra else 0) for i, p in enumerate(healthy)}
        cursor = 0
        for home, m in tasks:
            while quota[healthy[cursor % len(healthy)]] <= 0:
                cursor += 1
            q = healthy[cursor % len(healthy)]
            quota[q] -= 1
            cursor += 1
            moved[(home, m, s)] = q
    return Routing(job, tuple(sorted(failed)), moved)
