"""Which alive peer runs each micro-batch at each stage.

Any alive worker of a stage may serve any micro-batch there (rule 1); the routings here span that
space from least to most change: re-routing only the failed workers' micro-batches
(`balanced_routing`), mixes keeping part of each damaged pipeline (`mixed_routing`), dissolving the
damaged pipelines (`dissolving_routing`), and re-forming the survivors into whole chains
(`lane_routing`). Loads are kept as close to even as the routing's shape allows (the per-worker
work bound is driven by the most loaded peer), and moved micro-batches are dealt out in index order
so extra work arrives spread through the iteration rather than in one burst.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from planner.spec import JobSpec, Worker
from planner.timeline import Op


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

    @property
    def busiest(self) -> list[int]:
        """Per stage, the most micro-batches one alive worker of it runs (the loads the bounds
        take as `busiest`)."""
        return [max(self.load[p][s] for p in range(self.job.pipelines)) for s in range(self.job.stages)]

    @property
    def busiest_work(self) -> list[float]:
        """Per stage, the F + B + W work (ms) of its busiest worker: `busiest` times a micro-batch's
        three ops there (what `kept_stage_sets` ranks and `heuristic.bottleneck_stage` maximises)."""
        costs = self.job.costs
        return [n * (costs.forward[s] + costs.backward_input[s] + costs.backward_weight[s])
                for s, n in enumerate(self.busiest)]



def balanced_routing(job: JobSpec, failed: tuple[Worker, ...], rotate: int = 0) -> Routing:
    """Deal each failed worker's micro-batches round-robin over the least-loaded alive peers.

    `rotate` shifts which peer receives the first moved micro-batch (the heuristic tries a few).
    Where the loads cannot be equal, the peers that take one more are those cut from the fewest
    neighbours (`cut_sides`), in the rotated order among equals.
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
        order = peers[rotate % len(peers):] + peers[: rotate % len(peers)]
        # The busiest peers set the period, and a peer whose own pipeline is dead next to it
        # receives every forward, or returns every gradient, over a cross-pipeline hop, so its
        # round trips start later and end later: the extra micro-batches go to uncut peers first
        # (gpt-1.5b 8 x 8 x 24 with (1, 3) and (5, 2) dead, 10 s plans: 1495.6 -> 1482.1 ms, bound
        # 1451.5; docs/notes/planner-issue8.md, S). Sorting is stable: equals keep the rotation.
        ranked = sorted(order, key=lambda p: cut_sides(dead, p, s))
        takes_extra = set(ranked[:extra])
        quota = {p: base + (p in takes_extra) - job.microbatches for p in order}
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


def routing_of(job: JobSpec, failed: tuple[Worker, ...], ops: Iterable[Op]) -> Routing:
    """The routing a schedule follows: which pipeline's worker runs each micro-batch's forward at
    each stage (its B and W run there too, rule 1). A schedule routed as its ops arrive
    (`Policy.dynamic_routing`) becomes a fixed routing the other schedulers can take."""
    moved = {(*op.microbatch, op.worker[1]): op.worker[0]
             for op in ops if op.kind == "F" and op.worker[0] != op.microbatch[0]}
    return Routing(job, failed, moved)


def cut_sides(dead: set[Worker], pipeline: int, stage: int) -> int:
    """How many of the worker's same-pipeline neighbours (stage - 1, stage + 1) are dead."""
    return ((pipeline, stage - 1) in dead) + ((pipeline, stage + 1) in dead)


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


def stage_mixed_routing(job: JobSpec, failed: tuple[Worker, ...], kept: frozenset[int]) -> Routing | None:
    """The damaged pipelines dissolved except at the stages in `kept`, where their alive workers
    serve their own micro-batches: dropping the damaged pipelines, with their survivors put back
    only where they relieve a heavy stage. Re-routing every failed worker's share keeps all of them
    busy, and each of their micro-batches then changes pipelines at every failed stage and back;
    dissolving pays no crossing but leaves them idle. Between the two, per stage: made-up 8 x 7 x
    18 with pipeline 7 dead at stages 1, 2, 4 and 6, stage 3 (24.5 ms a micro-batch) carrying 21 on
    each of seven workers when dissolved, 18 on eight with (7, 3) kept; with (7, 0) kept too the
    list schedules reach 549.2 ms, against 561.5-583.7 dissolved and 574.4 re-routed (notes AI).
    None when every pipeline is damaged."""
    dissolved = dissolving_routing(job, failed)
    if dissolved is None:
        return None
    dead = set(failed)
    moved = {key: q for key, q in dissolved.moved.items()
             if key[2] not in kept or (key[0], key[2]) in dead}
    return Routing(job, tuple(sorted(failed)), moved)


def kept_stage_sets(job: JobSpec, failed: tuple[Worker, ...]) -> list[frozenset[int]]:
    """The `kept` sets `stage_mixed_routing` is tried with: the stages where a damaged pipeline
    has an alive worker, ranked by the work their busiest worker carries when the damaged pipelines
    are dissolved (micro-batches x (F + B + W)), heaviest first; then the first one, the first two,
    and so on (keeping a light stage's survivors adds crossings and relieves nothing)."""
    dissolved = dissolving_routing(job, failed)
    if dissolved is None:
        return []
    dead = set(failed)
    damaged = sorted({p for p, _ in failed})
    work = dissolved.busiest_work
    stages = [s for s in range(job.stages) if any((p, s) not in dead for p in damaged)]
    stages.sort(key=lambda s: (-work[s], s))
    return [frozenset(stages[:k]) for k in range(1, len(stages) + 1)]


def lane_routing(job: JobSpec, failed: tuple[Worker, ...], spill: bool = False) -> Routing | None:
    """Re-formed pipelines ("lanes"): as many chains through the alive workers as the emptiest stage
    has survivors, every micro-batch on one chain at every stage.

    Where failures are spread over the pipelines (one per stage, say), dropping or dissolving the
    damaged pipelines leaves few or none, and re-routing each failed worker's micro-batches to all its
    peers makes every peer wait on several senders. But any same-stage peer may serve any micro-batch
    (rule 1), so the survivors can be wired into L = min_s alive_s chains, each a pipeline of its own
    with the D x M micro-batches dealt evenly among them: every worker of a chain serves
    ceil(D x M / L) or one fewer, its forwards come from one sender and its gradients from one, and a
    chain pays a cross-pipeline hop only where it changes pipelines. (4 x 4 x 8 with one failure per
    stage and pipeline: three chains of 11 micro-batches, 389.0 ms against the bound's 388.0, where the
    re-routing candidates reached 414.) Chains start on the stage-0 workers whose own pipeline stays
    alive the longest and, where their pipeline's next worker is dead, continue on the free worker
    whose pipeline stays alive the longest from there. Alive workers on no chain serve nothing (they
    still all-reduce and step), unless `spill`: then at a stage with more survivors than chains the
    workers on no chain take an even share too. Dealing the micro-batches in index order (chains in
    turn), the i-th goes to the next such worker whenever floor((i + 1) x) > floor(i x), x their
    share of the stage's survivors: each worker there serves about D x M / alive_s, and their share
    comes from every chain, spread through the iteration. Where the widest stage is the bottleneck
    this is what keeps it busy (made-up 6 x 4 x 22, one failure at each of stages 0-2: on the chains
    five stage-3 workers of six get 26 or 27 micro-batches and the sixth none, spilled all six get
    22; list-scheduled 422.0 -> 382.6 ms at best over the list policies).
    None without failures or when a stage has no survivor."""
    dead = set(failed)
    D, S, M = job.pipelines, job.stages, job.microbatches
    alive = [[p for p in range(D) if (p, s) not in dead] for s in range(S)]
    lanes = min(len(workers) for workers in alive)
    if not dead or lanes == 0:
        return None
    run = [[0] * (S + 1) for _ in range(D)]  # how many stages from s on pipeline p stays alive
    for p in range(D):
        for s in range(S - 1, -1, -1):
            run[p][s] = 0 if (p, s) in dead else 1 + run[p][s + 1]
    chain = sorted(alive[0], key=lambda p: (-run[p][0], p))[:lanes]
    micro = [(home, m) for m in range(M) for home in range(D)]  # index order, pipelines interleaved
    moved: dict[tuple[int, int, int], int] = {}
    for s in range(S):
        if s > 0:
            free = sorted((p for p in alive[s] if p not in chain), key=lambda p: (-run[p][s], p))
            chain = [p if (p, s) not in dead else free.pop(0) for p in chain]
        workers = chain + ([p for p in alive[s] if p not in chain] if spill else [])
        dealt = _spilled_deal(len(micro), lanes, len(workers) - lanes)
        for (home, m), served in zip(micro, dealt, strict=True):
            q = workers[served]
            if q != home:
                moved[(home, m, s)] = q
    return Routing(job, tuple(sorted(failed)), moved)


def _spilled_deal(count: int, lanes: int, extras: int) -> list[int]:
    """Who serves each of `count` micro-batches dealt to `lanes` chains in turn when `extras` more
    workers take an even share: a chain's index, or lanes + an extra's. The i-th goes to the next
    extra whenever floor((i + 1) x) > floor(i x), x = extras / (lanes + extras) (whole numbers, so
    no rounding moves one). Where the chain count and that stride share a factor, those spills
    would fall on the same chains every time (4 micro-batches, 2 chains, 2 extras: both on the
    second chain, which keeps none); then each chain gives up its excess over an even share
    itself, spread through its own micro-batches. Without extras: the chains in turn."""
    workers = lanes + extras
    served, spilled = [], 0
    for i in range(count):
        if (i + 1) * extras // workers > i * extras // workers:
            served.append(lanes + spilled % extras)
            spilled += 1
        else:
            served.append(i % lanes)
    loads = Counter(served)
    if max(loads[w] for w in range(workers)) - min(loads[w] for w in range(workers)) <= 1:
        return served
    base, rem = divmod(count, workers)
    own = [count // lanes + (lane < count % lanes) for lane in range(lanes)]  # dealt to each in turn
    keep = [min(own[lane], base + (lane < rem)) for lane in range(lanes)]
    served, spilled = [], 0
    for i in range(count):
        lane, j = i % lanes, i // lanes  # j: the lane's own index of the i-th micro-batch
        give = own[lane] - keep[lane]
        if (j + 1) * give // own[lane] > j * give // own[lane]:
            served.append(lanes + spilled % extras)
            spilled += 1
        else:
            served.append(lane)
    return served
