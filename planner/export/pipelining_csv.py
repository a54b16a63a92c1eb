"""A fault-free plan as the compute-only CSV of `torch.distributed.pipelining`.

`_PipelineScheduleRuntime._load_csv(path, format="compute_only")` (torch 2.13.0, private API) reads
one row per rank, each cell an action `<stage><type><microbatch>`: F forward, I input-gradient
backward, W weight-gradient backward. Our B (gradient w.r.t. the stage input) is torch's I. torch
runs one stage per rank inside one pipeline group, so only a plan without failures maps onto it: the
export takes pipeline 0's workers (rank = stage) in their planned order. A re-routed plan has no such
form (micro-batches cross pipelines), and gets a ValueError saying so.
"""

from __future__ import annotations

import csv
import io
from typing import Any

from planner.export._read import failed_workers, grid_size, read_ops

TORCH_ACTION = {"F": "F", "B": "I", "W": "W"}
_ORDER = {"F": 0, "B": 1, "W": 2}


def pipelining_csv(timeline: dict[str, Any]) -> str:
    """One CSV row per rank (= stage of pipeline 0), cells like `0F0,0I0,0W0`."""
    failed = failed_workers(timeline)
    if failed:
        shown = ", ".join(f"[{p}, {s}]" for p, s in failed[:8]) + (" ..." if len(failed) > 8 else "")
        raise ValueError(
            f"pipelining CSV needs a plan without failures; this one has {len(failed)} failed "
            f"worker(s) ({shown}). torch.distributed.pipelining runs one stage per rank within one "
            "pipeline, so re-routed micro-batches cannot be expressed"
        )
    ops = read_ops(timeline)
    _, stages = grid_size(timeline, ops)
    rows: list[list[tuple[float, float, int, str]]] = [[] for _ in range(stages)]
    for op in ops:
        if op.worker[0] != 0 or op.microbatch is None:
            continue
        stage, (home, index) = op.worker[1], op.microbatch
        if home != 0:
            raise ValueError(
                f"pipelining CSV: worker [0, {stage}] runs micro-batch [{home}, {index}] of "
                "another pipeline, which a fault-free plan never does"
            )
        if not 0 <= stage < stages:
            raise ValueError(f"pipelining CSV: op on stage {stage}, outside 0..{stages - 1}")
        cell = f"{stage}{TORCH_ACTION[op.kind]}{index}"
        rows[stage].append((op.start_ms, op.end_ms, _ORDER[op.kind], cell))
    for stage, row in enumerate(rows):
        if not row:
            raise ValueError(f"pipelining CSV: pipeline 0 has no compute ops at stage {stage}")
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    for row in rows:
        row.sort()
        writer.writerow([cell for *_, cell in row])
    return out.getvalue()
