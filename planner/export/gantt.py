"""Gantt chart (PNG) of a plan timeline: one row per worker, one colour per op kind.

Drawn with one PolyCollection per (kind, re-routed) group rather than one artist per op, so an
8 x 8 x 24 plan (~4,600 ops) and a 32 x 16 x 64 one (~100k ops) render in about the same handful of
draw calls. Re-routed micro-batches (run away from their home pipeline) are hatched with a dark
edge; failed workers get a grey row labelled `failed`. matplotlib is imported inside the function
(Agg backend, no display) so importing the planner stays fast.
"""

from __future__ import annotations

import io
from typing import Any

from planner.export._read import KINDS, failed_workers, grid_size, read_ops

KIND_COLOUR = {
    "F": "#4c72b0",
    "B": "#dd8452",
    "W": "#55a868",
    "ALLREDUCE": "#c44e52",
    "OPTIMIZER": "#8172b3",
}
REROUTED_EDGE = "#111111"
FAILED_ROW = "#d9d9d9"
_DPI = 100
_MAX_HEIGHT_PX = 6000
_MIN_HEIGHT_PX = 320
_LABEL_EVERY_ROW_UP_TO = 96


def gantt_png(timeline: dict[str, Any], width_px: int = 1600) -> bytes:
    """The timeline drawn as a PNG (bytes)."""
    if not isinstance(width_px, int) or not 300 <= width_px <= 20000:
        raise ValueError(f"width_px: must be an integer in 300..20000, got {width_px!r}")
    ops = read_ops(timeline)
    pipelines, stages = grid_size(timeline, ops)
    dead = set(failed_workers(timeline))

    import matplotlib

    matplotlib.use("Agg", force=False)
    import numpy as np
    from matplotlib.collections import PolyCollection
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    rows = [(p, s) for p in range(pipelines) for s in range(stages)]
    row_of = {w: i for i, w in enumerate(rows)}
    for op in ops:  # a worker outside the job's grid still gets a row rather than an error
        if op.worker not in row_of:
            row_of[op.worker] = len(rows)
            rows.append(op.worker)
    n_rows = len(rows)
    row_px = max(2.0, min(18.0, 2400.0 / n_rows))
    height_px = min(_MAX_HEIGHT_PX, max(_MIN_HEIGHT_PX, int(n_rows * row_px) + 170))
    fig = Figure(figsize=(width_px / _DPI, height_px / _DPI), dpi=_DPI)
    ax = fig.add_subplot()

    end_ms = max((o.end_ms for o in ops), default=1.0)
    for w in dead:
        if w in row_of:
            ax.axhspan(row_of[w] - 0.5, row_of[w] + 0.5, color=FAILED_ROW, zorder=0)
            if n_rows <= _LABEL_EVERY_ROW_UP_TO:
                ax.text(end_ms / 2, row_of[w], "failed", ha="center", va="center",
                        fontsize=max(5.0, min(9.0, row_px * 0.6)), color="#555555", zorder=1)

    # Group rectangles: (kind, rerouted) -> arrays of (row, start, end).
    groups: dict[tuple[str, bool], list[tuple[int, float, float]]] = {}
    for op in ops:
        groups.setdefault((op.kind, op.rerouted), []).append(
            (row_of[op.worker], op.start_ms, op.end_ms))
    thin_edges = len(ops) <= 20_000
    for (kind, rerouted), rects in sorted(groups.items()):
        a = np.asarray(rects, dtype=float)
        y0, y1 = a[:, 0] - 0.4, a[:, 0] + 0.4
        verts = np.stack([
            np.column_stack([a[:, 1], y0]), np.column_stack([a[:, 1], y1]),
            np.column_stack([a[:, 2], y1]), np.column_stack([a[:, 2], y0]),
        ], axis=1)
        if rerouted:
            coll = PolyCollection(verts, facecolors=KIND_COLOUR[kind], edgecolors=REROUTED_EDGE,
                                  linewidths=0.6, hatch="////", zorder=3)
        else:
            coll = PolyCollection(verts, facecolors=KIND_COLOUR[kind],
                                  edgecolors="white" if thin_edges else "none",
                                  linewidths=0.3 if thin_edges else 0.0, zorder=2)
        ax.add_collection(coll)

    _axes_labels(ax, rows, dead, pipelines, stages)
    ax.set_xlim(0, end_ms * 1.005)
    ax.set_ylim(n_rows - 0.5, -0.5)  # worker [0, 0] on top
    ax.set_xlabel("time in the iteration (ms)")
    period = timeline.get("iteration_ms")
    marks_period = isinstance(period, (int, float)) and 0 < period <= end_ms * 1.005
    if marks_period:
        ax.axvline(period, color="#333333", linestyle="--", linewidth=0.8, zorder=4)
    ax.set_title(_title(timeline, dead, marks_period), fontsize=10)

    handles = [Patch(facecolor=KIND_COLOUR[k], label=k) for k in KINDS]
    handles.append(Patch(facecolor="white", edgecolor=REROUTED_EDGE, hatch="////", label="re-routed"))
    handles.append(Patch(facecolor=FAILED_ROW, label="failed worker"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8, frameon=False)
    fig.subplots_adjust(left=0.09, right=0.99, top=1 - 60 / height_px, bottom=95 / height_px)

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=_DPI)
    return buf.getvalue()


def _axes_labels(ax, rows, dead, pipelines: int, stages: int) -> None:
    n_rows = len(rows)
    if n_rows <= _LABEL_EVERY_ROW_UP_TO:
        ax.set_yticks(range(n_rows))
        ax.set_yticklabels([f"[{p}, {s}]" + (" failed" if (p, s) in dead else "") for p, s in rows],
                           fontsize=max(4.0, min(8.0, 1000 / n_rows / 1.6)))
        ax.set_ylabel("worker [pipeline, stage]")
    else:
        # Too many rows to name each: label pipelines, and list the failed workers in the title.
        step = max(1, pipelines // 32)
        ax.set_yticks([p * stages + (stages - 1) / 2 for p in range(0, pipelines, step)])
        ax.set_yticklabels([f"pipeline {p}" for p in range(0, pipelines, step)], fontsize=7)
        ax.set_ylabel(f"workers ({stages} stages per pipeline)")
    for p in range(1, pipelines):
        ax.axhline(p * stages - 0.5, color="#999999", linewidth=0.4, zorder=1)


def _title(timeline: dict[str, Any], dead: set, marks_period: bool) -> str:
    """Periods that the timeline states (a foreign timeline may lack some), then the failures."""
    period = timeline.get("iteration_ms")
    bound = timeline.get("lower_bound_ms")
    parts = [f"{label} {timeline[key]:.1f} ms" for key, label in
             (("iteration_ms", "iteration"), ("fault_free_iteration_ms", "fault-free"),
              ("lower_bound_ms", "bound")) if isinstance(timeline.get(key), (int, float))]
    if isinstance(period, (int, float)) and isinstance(bound, (int, float)) and bound > 0:
        parts[-1] += f" (gap {100 * (period / bound - 1):.2f}%)"
    failed = sorted(dead)
    shown = ", ".join(f"[{p}, {s}]" for p, s in failed[:10]) + (" ..." if len(failed) > 10 else "")
    line2 = f"failed: {shown}" if failed else "no failures"
    if marks_period:
        line2 += "  (dashed line: steady-state period)"
    return "  |  ".join(parts) + "\n" + line2 if parts else line2
