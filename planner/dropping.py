"""The plan of dropping the damaged pipelines, as a candidate of the failure plan itself.

Rule 1 lets any alive same-stage peer serve any micro-batch, so running the undamaged D' pipelines
as a fault-free job that carries the whole global batch is a valid plan for the failure set: the
job "D' pipelines, ceil(D x M / D') micro-batches each", planned on its own and relabelled here,
makes the adapted plan never slower than dropping, by construction. When D' does not divide D x M
some slots of that plan carry no micro-batch: their F/B/W ops are deleted. Deleting ops only removes
constraints (rules 3-6 still hold at the written times, and every op's replayed time is a max over
fewer paths), so the period is at most the dropped job's.
"""

from __future__ import annotations

from planner.spec import JobSpec, Worker
from planner.timeline import Op


def damaged_split(job: JobSpec, failed: tuple[Worker, ...]) -> tuple[list[int], list[int]]:
    damaged = sorted({p for p, _ in failed})
    return damaged, [p for p in range(job.pipelines) if p not in damaged]


def dropped_job(job: JobSpec, failed: tuple[Worker, ...]) -> JobSpec | None:
    """The job the undamaged pipelines run when the damaged ones are dropped: ceil(D x M / D')
    micro-batches each (None when no pipeline is left undamaged)."""
    damaged, healthy = damaged_split(job, failed)
    total = job.pipelines * job.microbatches
    if not damaged or not healthy:
        return None
    return JobSpec.model_validate({**job.model_dump(), "pipelines": len(healthy),
                                   "microbatches": -(-total // len(healthy))})


def relabel_dropped(job: JobSpec, failed: tuple[Worker, ...], dropped: JobSpec,
                    dropped_ops: list[Op]) -> list[Op]:
    """Map a plan of `dropped` onto the real job: its pipeline i is the i-th undamaged pipeline,
    which serves its own M micro-batches first and then its share of the damaged pipelines'
    (dealt in index order, the first pipelines one more when D' does not divide them; the slots
    left over carry nothing and their ops are deleted). Alive workers of damaged pipelines join
    their stage's all-reduce."""
    damaged, healthy = damaged_split(job, failed)
    extra = [(p, m) for m in range(job.microbatches) for p in damaged]
    base, more = divmod(len(extra), len(healthy))
    served, at = {}, 0
    for i, q in enumerate(healthy):
        share = base + (1 if i < more else 0)
        served[i] = [(q, m) for m in range(job.microbatches)] + extra[at:at + share]
        at += share
    out: list[Op] = []
    collectives: dict[tuple[int, str], Op] = {}
    for op in dropped_ops:
        q = healthy[op.worker[0]]
        mb = None
        if op.microbatch is not None:
            mine = served[op.microbatch[0]]
            if op.microbatch[1] >= len(mine):
                continue  # a slot that carries no micro-batch
            mb = mine[op.microbatch[1]]
        out.append(Op((q, op.worker[1]), op.kind, mb, op.start_ms, op.end_ms))
        if op.microbatch is None:
            collectives.setdefault((op.worker[1], op.kind), op)
    dead = set(failed)
    for p in damaged:
        for s in range(job.stages):
            if (p, s) not in dead:
                for kind in ("ALLREDUCE", "OPTIMIZER"):
                    ref = collectives[(s, kind)]
                    out.append(Op((p, s), kind, None, ref.start_ms, ref.end_ms))
    return out
