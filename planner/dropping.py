"""The plan of dropping the damaged pipelines, as a candidate of the failure plan itself.

Rule 1 lets any alive same-stage peer serve any micro-batch, so running the undamaged D' pipelines
as a fault-free job that carries the whole global batch is a valid plan for the failure set. When
D' divides D x M that job is exactly "D' pipelines, D x M / D' micro-batches each": planned on its
own and relabelled here, it makes the adapted plan never slower than dropping, by construction.
"""

from __future__ import annotations

from planner.spec import JobSpec, Worker
from planner.timeline import Op


def damaged_split(job: JobSpec, failed: tuple[Worker, ...]) -> tuple[list[int], list[int]]:
    damaged = sorted({p for p, _ in failed})
    return damaged, [p for p in range(job.pipelines) if p not in damaged]


def dropped_job(job: JobSpec, failed: tuple[Worker, ...]) -> JobSpec | None:
    """The job the undamaged pipelines run when the damaged ones are dropped (None when none is
    left, or when D' does not divide the global batch evenly)."""
    damaged, healthy = damaged_split(job, failed)
    total = job.pipelines * job.microbatches
    if not damaged or not healthy or total % len(healthy):
        return None
    return JobSpec.model_validate({**job.model_dump(), "pipelines": len(healthy),
                                   "microbatches": total // len(healthy)})


def relabel_dropped(job: JobSpec, failed: tuple[Worker, ...], dropped: JobSpec,
                    dropped_ops: list[Op]) -> list[Op]:
    """Map a plan of `dropped` onto the real job: its pipeline i is the i-th undamaged pipeline,
    which serves its own M micro-batches first and then its share of the damaged pipelines'
    (dealt in index order). Alive workers of damaged pipelines join their stage's all-reduce."""
    damaged, healthy = damaged_split(job, failed)
    extra = [(p, m) for m in range(job.microbatches) for p in damaged]
    per = dropped.microbatches - job.microbatches
    served = {i: [(q, m) for m in range(job.microbatches)] + extra[i * per:(i + 1) * per]
              for i, q in enumerate(healthy)}
    out: list[Op] = []
    collectives: dict[tuple[int, str], Op] = {}
    for op in dropped_ops:
        q = healthy[op.worker[0]]
        mb = served[op.microbatch[0]][op.microbatch[1]] if op.microbatch is not None else None
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
