"""Compressed plans: a few pipelines planned, the untouched ones copies of one representative.

At 1024 x 16 x 64 (3.1 M ops) every per-op Python loop over the whole job costs seconds, yet all but
a few pipelines run the fault-free template. So above `COMPRESS_MIN_OPS` the planner plans the
*compressed job* instead: the damaged pipelines, `receivers` undamaged pipelines that take their
re-routed micro-batches, and ONE representative untouched pipeline running the template. That is a
job of its own (D_c = f + receivers + 1 pipelines), so the unchanged validator checks its plan and the
unchanged simulator replays it. Copies of the representative add no cross-pipeline edge (each
serves exactly its own micro-batches, on its own workers) and start their ALLREDUCE at the
representative's time, which is the compressed plan's common start of that stage, so:
- rule 1: every untouched pipeline q serves its own (q, j) once per stage, as the representative
  serves (r, j); the compressed job covers the rest;
- rules 2-4 and 6 hold per worker, and a copy's ops are the representative worker's, shifted in
  nothing but the pipeline index;
- rule 5: every alive worker of stage s starts ALLREDUCE at the compressed plan's common start;
- the replayed period is the compressed plan's: a copy's replay is the representative's op for
  op, so each stage's all-reduce waits for the same latest worker.

An `Expansion` keeps the compressed ops as groups (the ops of one compressed pipeline and the
concrete pipelines that run them) and expands to the full op list only when iterated
(`ExpandedOps`), e.g. for `timeline_json()`; its length and one worker's view are cheap.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from functools import cached_property
from typing import overload

from planner.spec import JobSpec, SpecError, Worker
from planner.timeline import Op

COMPRESS_MIN_OPS = 250_000
"""F/B/W ops of the whole job above which the planner compresses (below it nothing changes: every
plan of `benchmarks/plan_hashes.txt` and every test job is far smaller). Measured trade-off in
docs/design.md ("Scale")."""
COMPRESSED_MAX_OPS = 80_000
"""F/B/W op budget of the compressed job; sets how many receivers it gets (26 pipelines at 16 x 64,
about the size the heuristic plans in ~3 s: the bar at 1024 x 16 x 64 with 16 failures)."""

MicrobatchMap = Callable[[int, tuple[int, int]], tuple[int, int]]
"""(copy index, compressed micro-batch) -> concrete micro-batch."""


@dataclass(frozen=True)
class Group:
    """The ops of one compressed pipeline `source` (compressed numbering) and the concrete pipelines
    that run them: copy k runs them as pipeline `pipelines[k]`, micro-batches mapped by
    `microbatch(k, mb)`. A group with several copies serves only its own micro-batches."""

    source: int
    ops: tuple[Op, ...]
    pipelines: tuple[int, ...]
    microbatch: MicrobatchMap


def receivers_for(job: JobSpec, damaged: int) -> int:
    """Undamaged pipelines planned beside the `damaged` ones: as many as fit the compressed job's op
    budget with the representative, at least one, and never all the undamaged ones."""
    per_pipeline = 3 * job.stages * job.microbatches
    fit = COMPRESSED_MAX_OPS // per_pipeline - damaged - 1
    return max(1, min(fit, job.pipelines - damaged - 1))


def can_compress(job: JobSpec, damaged: int) -> bool:
    """A compressed job needs one receiver and the representative besides the damaged pipelines."""
    return job.pipelines - damaged >= 2


def should_compress(job: JobSpec, damaged: int) -> bool:
    return job.op_count > COMPRESS_MIN_OPS and can_compress(job, damaged)


PLANNED_OPS_MAX = 400_000
"""Most F/B/W ops one plan schedules at once: the whole job, or the compressed job (the damaged
pipelines, a receiver and the representative). A 1 x 16 x 4096 pipeline (196,640 ops) takes 36 s
and 2.5 GB to plan fault-free on the 2-core box; far beyond this a plan would run for hours and
exhaust memory (1 x 4096 x 10^6 is 1.2 x 10^10 ops), so such a job is refused with its reason."""
BUSIEST_WORK_MS_MAX = 1e8
"""Most work (ms) the busiest worker may carry in one iteration (27.8 hours). Timelines are float
milliseconds written to 1e-6 ms: at 1e11 ms a float keeps about 1e-5 ms, and a 1 x 2 x 20,000 job
of 1e7 ms forwards and 0.001 ms B and W came out with every B and W 0.001007 ms long (rule 2)."""


def check_plannable(job: JobSpec, failed: Sequence[Worker] = (), compressed: bool | None = None) -> None:
    """Raise `SpecError` (naming `microbatches`) when planning `job` with `failed` dead would
    schedule more than `PLANNED_OPS_MAX` F/B/W ops at once, or when its busiest worker's work alone
    exceeds `BUSIEST_WORK_MS_MAX` (every plan's iteration is at least that long). `compressed`
    None: compressed as `planner.solve.plan` decides by default (`should_compress`)."""
    D, S, M = job.pipelines, job.stages, job.microbatches
    damaged = len({p for p, _ in failed})
    if compressed is None:
        compressed = should_compress(job, damaged)
    per_pipeline = 3 * S * M
    pipelines = (min(D, damaged + 2) if damaged else 1) if compressed else D
    planned = per_pipeline * pipelines
    if planned > PLANNED_OPS_MAX:
        scope = (f"{damaged} damaged pipeline{'s' * (damaged != 1)}, a receiver and the representative"
                 if compressed and damaged else f"{pipelines} pipeline{'s' * (pipelines != 1)}")
        raise SpecError(
            f"microbatches: job too large to plan: {S} stages x {M} microbatches x 3 = "
            f"{per_pipeline:,} F/B/W ops per pipeline, {planned:,} to schedule at once ({scope}), "
            f"over the planner's limit of {PLANNED_OPS_MAX:,}", field="microbatches")
    c = job.costs
    work = [f + b + w for f, b, w in zip(c.forward, c.backward_input, c.backward_weight, strict=True)]
    dead_at = Counter(s for _, s in set(map(tuple, failed)))
    busiest = max(  # (a stage without a survivor is refused by `planner.failures.normalize`)
        (-(-D * M // (D - dead_at[s])) * work[s] for s in range(S) if dead_at[s] < D), default=0.0)
    if busiest > BUSIEST_WORK_MS_MAX:
        raise SpecError(
            f"microbatches: job too long to plan: its busiest worker alone works {busiest:.4g} ms an "
            f"iteration, over {BUSIEST_WORK_MS_MAX:g} ms, where the timeline's float milliseconds "
            f"no longer hold its ops' durations to 1e-6 ms", field="microbatches")


def with_pipelines(job: JobSpec, pipelines: int) -> JobSpec:
    return JobSpec.model_validate({**job.model_dump(), "pipelines": pipelines})


def relabel_template(template: Sequence[Op], pipeline: int) -> list[Op]:
    """One pipeline's fault-free plan run as `pipeline` (its own micro-batches)."""
    return [Op((pipeline, o.worker[1]), o.kind, None if o.microbatch is None else (pipeline, o.microbatch[1]),
               o.start_ms, o.end_ms) for o in template]


def align_collectives(ops: list[Op]) -> list[Op]:
    """Every ALLREDUCE of a stage moved to the stage's latest start (its OPTIMIZER with it): rule 5's
    common start for parts planned apart. Later collectives keep rules 3-6 (they are each worker's
    last ops and follow every W), so the plan stays valid."""
    start: dict[int, float] = {}
    for o in ops:
        if o.kind == "ALLREDUCE":
            start[o.worker[1]] = max(start.get(o.worker[1], o.start_ms), o.start_ms)
    shift = {o.worker: start[o.worker[1]] - o.start_ms for o in ops if o.kind == "ALLREDUCE"}
    return [o if o.microbatch is not None or not shift.get(o.worker) else
            Op(o.worker, o.kind, None, o.start_ms + shift[o.worker], o.end_ms + shift[o.worker]) for o in ops]


@dataclass
class Expansion:
    """A plan kept compressed: groups of ops and the concrete pipelines that run each group."""

    groups: tuple[Group, ...]
    job: JobSpec | None = None
    """The compressed job (None when the groups are not one: the dropped-pipelines candidate)."""
    failed: tuple[Worker, ...] = ()
    ops: tuple[Op, ...] = ()
    """The compressed job's plan (compressed numbering) that the unchanged validator checks."""
    name: str = ""

    def op_count(self) -> int:
        return sum(len(g.ops) * len(g.pipelines) for g in self.groups)

    def expand(self) -> Iterator[Op]:
        """Every concrete op, group by group and copy by copy (worker and micro-batch tuples shared)."""
        for g in self.groups:
            for k, q in enumerate(g.pipelines):
                workers: dict[int, Worker] = {}
                for o in g.ops:
                    s = o.worker[1]
                    w = workers.get(s)
                    if w is None:
                        w = workers[s] = (q, s)
                    mb = None if o.microbatch is None else g.microbatch(k, o.microbatch)
                    yield Op(w, o.kind, mb, o.start_ms, o.end_ms)

    def in_worker_order(self) -> Iterator[Op]:
        """Every concrete op, sorted by (worker, start) as `sorted(ops, key=...)` would (stable:
        equal starts keep the group's order), one at a time: a timeline is written without holding
        the full op list."""
        copy_of = self._copy_of
        stages: dict[int, dict[int, list[Op]]] = {}
        for g in self.groups:
            per_stage = stages[g.source] = {}
            for o in g.ops:
                per_stage.setdefault(o.worker[1], []).append(o)
            for seq in per_stage.values():
                seq.sort(key=lambda o: o.start_ms)
        for q in sorted(copy_of):
            g, k = copy_of[q]
            for s, seq in sorted(stages[g.source].items()):
                w = (q, s)
                for o in seq:
                    mb = None if o.microbatch is None else g.microbatch(k, o.microbatch)
                    yield Op(w, o.kind, mb, o.start_ms, o.end_ms)

    @cached_property
    def _copy_of(self) -> dict[int, tuple[Group, int]]:
        """Concrete pipeline -> (its group, its copy index)."""
        return {q: (g, k) for g in self.groups for k, q in enumerate(g.pipelines)}

    @cached_property
    def _runs(self) -> dict[tuple[str, tuple[int, int], int], tuple[int, float]]:
        """(F or B, compressed micro-batch, stage) -> the compressed pipeline that runs it and its
        start; built once (a service answers every worker's stream from one plan)."""
        return {(o.kind, o.microbatch, o.worker[1]): (g.source, o.start_ms)
                for g in self.groups for o in g.ops if o.kind in ("F", "B")}

    def locate(self, pipeline: int) -> tuple[Group, int]:
        """The group and copy index that concrete `pipeline` runs."""
        return self._copy_of[pipeline]

    def worker_view(self, worker: Worker) -> tuple[list[Op], dict[tuple[str, tuple[int, int], int], Worker],
                                                   dict[tuple[str, tuple[int, int], int], float]]:
        """`worker`'s own ops in order, and where and when the F/B ops it exchanges with run
        (stages s +- 1), read from the compressed plan without expanding it."""
        from planner.timeline import worker_orders

        group, k = self.locate(worker[0])
        runs = self._runs
        single = {g.source: g.pipelines[0] for g in self.groups if len(g.pipelines) == 1}
        own = [o for o in group.ops if o.worker[1] == worker[1]]
        ops, placement, starts = [], {}, {}
        for o in own:
            mb = None if o.microbatch is None else group.microbatch(k, o.microbatch)
            ops.append(Op(worker, o.kind, mb, o.start_ms, o.end_ms))
            if mb is None:
                continue
            for kind in ("F", "B"):
                for s in (worker[1] - 1, worker[1] + 1):
                    run = runs.get((kind, o.microbatch, s))
                    if run is not None:  # a copied group keeps its micro-batches to itself
                        source, start = run
                        pipe = worker[0] if source == group.source else single[source]
                        placement[(kind, mb, s)] = (pipe, s)
                        starts[(kind, mb, s)] = start
        return worker_orders(ops).get(worker, []), placement, starts


class ExpandedOps(Sequence[Op]):
    """The full op list of an `Expansion`, built on first use (`len` never builds it)."""

    def __init__(self, expansion: Expansion):
        self.expansion = expansion
        self._count = expansion.op_count()
        self._ops: list[Op] | None = None

    def materialize(self) -> list[Op]:
        if self._ops is None:
            self._ops = list(self.expansion.expand())
        return self._ops

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> Op: ...
    @overload
    def __getitem__(self, i: slice) -> list[Op]: ...
    def __getitem__(self, i):
        return self.materialize()[i]

    def __iter__(self) -> Iterator[Op]:
        return iter(self.materialize())

    def __eq__(self, other: object) -> bool:
        return list(self) == list(other) if isinstance(other, (list, ExpandedOps)) else NotImplemented


def _by_pipeline(ops: Sequence[Op]) -> dict[int, list[Op]]:
    out: dict[int, list[Op]] = {}
    for o in ops:
        out.setdefault(o.worker[0], []).append(o)
    return out


def replicated_expansion(template: Sequence[Op], pipelines: int) -> Expansion:
    """The fault-free plan of a whole job: one group, copied onto every pipeline."""
    every = tuple(range(pipelines))
    return Expansion((Group(0, tuple(template), every, lambda k, mb: (every[k], mb[1])),), name="replicated")


def reroute_expansion(job: JobSpec, failed: tuple[Worker, ...], to_concrete: Sequence[int],
                      planned: Sequence[Op], template: Sequence[Op], receivers: int) -> Expansion:
    """The compressed job's plan and its expansion. `planned` is a plan (canonical numbering) of the
    damaged pipelines 0..f-1 plus `receivers` undamaged ones; the representative f + receivers runs
    `template`, all collectives start together, and the representative stands for every undamaged
    pipeline not planned (`to_concrete[f + receivers:]`)."""
    rep = len({p for p, _ in failed}) + receivers
    compressed = with_pipelines(job, rep + 1)
    ops = align_collectives([*planned, *relabel_template(template, rep)])
    mapped = tuple(to_concrete)
    parts = _by_pipeline(ops)
    groups = [Group(c, tuple(parts.get(c, ())), (mapped[c],), lambda k, mb: (mapped[mb[0]], mb[1]))
              for c in range(rep)]
    copies = mapped[rep:]
    groups.append(Group(rep, tuple(parts[rep]), copies, lambda k, mb: (copies[k], mb[1])))
    return Expansion(tuple(groups), compressed, tuple(failed), tuple(ops),
                     name=f"compressed({rep - receivers} damaged + {receivers} receivers + "
                          f"1 representative of {len(copies)})")


def dropping_expansion(job: JobSpec, failed: tuple[Worker, ...], to_concrete: Sequence[int],
                       dropped_template: Sequence[Op]) -> Expansion:
    """`planner.dropping.relabel_dropped` kept compressed: the undamaged pipelines that serve one
    micro-batch more (the dropped job's whole template) and those that serve one fewer (its last
    slot deleted) are two groups, and each damaged pipeline's alive workers only join their stage's
    all-reduce. Same ops as relabel_dropped, mapped to concrete pipelines."""
    from planner.dropping import damaged_split

    damaged, healthy = damaged_split(job, failed)
    M = job.microbatches
    extra = [(p, m) for m in range(M) for p in damaged]
    base, more = divmod(len(extra), len(healthy))
    served, at = [], 0
    for i, q in enumerate(healthy):
        share = base + (1 if i < more else 0)
        served.append([(to_concrete[q], m) for m in range(M)]
                      + [(to_concrete[p], m) for p, m in extra[at:at + share]])
        at += share
    f = len(damaged)
    groups: list[Group] = []
    dead = set(failed)
    collectives = {(o.worker[1], o.kind): o for o in dropped_template if o.microbatch is None}
    for p in damaged:
        alive = [Op((p, s), kind, None, collectives[(s, kind)].start_ms, collectives[(s, kind)].end_ms)
                 for s in range(job.stages) if (p, s) not in dead for kind in ("ALLREDUCE", "OPTIMIZER")]
        groups.append(Group(p, tuple(alive), (to_concrete[p],), lambda k, mb: mb))
    kinds = [(0, more, M + base + 1), (1, len(healthy), M + base)] if more else [(0, len(healthy), M + base)]
    first = 0
    for offset, last, slots in kinds:
        c = f + offset
        ops = tuple(Op((c, o.worker[1]), o.kind, None if o.microbatch is None else (c, o.microbatch[1]),
                       o.start_ms, o.end_ms)
                    for o in dropped_template if o.microbatch is None or o.microbatch[1] < slots)
        members = served[first:last]
        groups.append(Group(c, ops, tuple(to_concrete[q] for q in healthy[first:last]),
                            lambda k, mb, members=members: members[k][mb[1]]))
        first = last
    return Expansion(tuple(groups), name=f"compressed-drop({f} damaged, {len(healthy)} serving)")
