"""The contract's precedence rules (3 and 5) stated once: which op waits for which, and how long.

Rule 3, within one micro-batch (home pipeline p, index m):
- F at stage s > 0 starts no earlier than F at s-1 ends plus the hop between s-1 and s;
- B at stage s < S-1 starts no earlier than B at s+1 ends plus the hop between s and s+1;
- on the last stage B starts after its F ends; W starts after its B ends (same worker, no hop).
The hop is `p2p_ms`, or `cross_pipeline_p2p_ms` when the two ops' workers sit in different
pipelines (`StageCosts.hop_ms` resolves per-stage lists).
Rule 5, per stage s: every ALLREDUCE of s starts after every W of s has ended (and all of them at
one common time); on each worker OPTIMIZER follows its ALLREDUCE.
Rule 4 (one op at a time) adds each worker's own order on top; it depends on the plan, not on
the contract, so the consumers add it themselves.

Consumers keep their own fast layouts but take the edges from here: the validator walks
`data_edges`, the replay vectorizes `INPUTS` with numpy masks, CP-SAT posts one constraint per
`Need`, the schedulers look ahead with `needs` and forward with `fed_by`, and everyone builds the
collectives with `collective_ops`.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

from planner.spec import StageCosts, Worker
from planner.timeline import Key, Op


@dataclass(frozen=True, slots=True)
class Input:
    """Rule 3 for one kind: op `kind` at stage s waits for op `source` of the same micro-batch at
    stage s + `offset`; a hop is paid when the offset is not 0 (the data crosses a stage boundary)."""

    kind: str
    source: str
    offset: int
    last_stage_only: bool = False

    def applies(self, stage, last):
        """Whether the rule binds at `stage` (an int, or a numpy array of stages: elementwise)."""
        there = stage + self.offset
        hit = (there >= 0) & (there <= last)
        return hit & (stage == last) if self.last_stage_only else hit


INPUTS: tuple[Input, ...] = (
    Input("F", "F", -1),  # F(s-1) -> F(s), hop between s-1 and s
    Input("B", "F", 0, last_stage_only=True),  # last stage: F -> B
    Input("B", "B", +1),  # B(s+1) -> B(s), hop between s and s+1
    Input("W", "B", 0),  # B -> W
)
"""Rule 3 in full. At most one rule binds for a given kind and stage."""

BARRIER_SOURCE = "W"
"""Rule 5: a stage's ALLREDUCEs wait for every op of this kind of their stage."""


@dataclass(frozen=True, slots=True)
class Need:
    """What a compute op of `kind` at `stage` waits for: `source` of the same micro-batch at
    `source_stage` plus `same_ms` (same pipeline) or `cross_ms` (different pipelines)."""

    kind: str
    stage: int
    source: str
    source_stage: int
    same_ms: float
    cross_ms: float

    def delay(self, source_pipeline: int, pipeline: int) -> float:
        return self.cross_ms if source_pipeline != pipeline else self.same_ms

    @property
    def hop(self) -> bool:
        """The data crosses a stage boundary (else it stays on one worker: no delay)."""
        return self.source_stage != self.stage


def needs(costs: StageCosts, stages: int) -> dict[tuple[str, int], Need]:
    """Rule 3 resolved for a job: (kind, stage) -> its `Need`, for every compute op that has one
    (F on stage 0 has none)."""
    last = stages - 1
    table: dict[tuple[str, int], Need] = {}
    for rule in INPUTS:
        for s in range(stages):
            if not rule.applies(s, last):
                continue
            there = s + rule.offset
            if rule.offset:
                boundary = min(s, there)
                same, cross = costs.hop_ms(boundary, False), costs.hop_ms(boundary, True)
            else:
                same = cross = 0.0
            assert (rule.kind, s) not in table, "rule 3 gives one input per kind and stage"
            table[(rule.kind, s)] = Need(rule.kind, s, rule.source, there, same, cross)
    return table


def fed_by(table: Mapping[tuple[str, int], Need]) -> dict[tuple[str, int], list[Need]]:
    """The same rules read forwards: (source kind, stage) -> the needs it satisfies, for
    schedulers that push an op's output to whoever waits for it."""
    out: dict[tuple[str, int], list[Need]] = {}
    for need in table.values():
        out.setdefault((need.source, need.source_stage), []).append(need)
    return out


def data_edges(
    table: Mapping[tuple[str, int], Need], where: Mapping[Key, Op]
) -> Iterator[tuple[Op, Op, float]]:
    """Rule 3 over a plan: (earlier op, later op, delay) for every compute op in `where` that has
    an input. Raises KeyError when the input is missing from the plan (rule 1 catches that)."""
    for (kind, home, m, s), op in where.items():
        need = table.get((kind, s))
        if need is not None:
            src = where[(need.source, home, m, need.source_stage)]
            yield src, op, need.delay(src.worker[0], op.worker[0])


def edges(job, ops: Sequence[Op]) -> list[tuple[Op, Op, float]]:
    """Every precedence of rules 3 and 5 between the ops of a plan, as (earlier, later, delay):
    the full graph spelled out (the consumers use the tables above directly, for speed)."""
    where = {(o.kind, o.microbatch[0], o.microbatch[1], o.worker[1]): o
             for o in ops if o.microbatch is not None}
    out = list(data_edges(needs(job.costs, job.stages), where))
    barrier: dict[int, list[Op]] = {}
    for o in ops:
        if o.kind == BARRIER_SOURCE:
            barrier.setdefault(o.worker[1], []).append(o)
    allreduce = {o.worker: o for o in ops if o.kind == "ALLREDUCE"}
    for o in ops:
        if o.kind == "ALLREDUCE":
            out += [(w, o, 0.0) for w in barrier.get(o.worker[1], ())]
        elif o.kind == "OPTIMIZER" and o.worker in allreduce:
            out.append((allreduce[o.worker], o, 0.0))
    return out


def collective_ops(costs: StageCosts, stage: int, workers: Iterable[Worker], at: float) -> list[Op]:
    """Rule 5's ops of one stage: an ALLREDUCE on each of `workers` (its alive workers) at the
    common start `at` (after every W of the stage), each followed by its OPTIMIZER."""
    ar_end = at + costs.allreduce[stage]
    opt_end = ar_end + costs.optimizer[stage]
    out = []
    for w in workers:
        out.append(Op(w, "ALLREDUCE", None, at, ar_end))
        out.append(Op(w, "OPTIMIZER", None, ar_end, opt_end))
    return out
