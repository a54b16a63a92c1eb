"""Chrome trace / Perfetto JSON of a plan timeline (open in ui.perfetto.dev or chrome://tracing).

One process per pipeline and one thread per worker, so the viewer groups a pipeline's stages
together; every op is a complete event ("ph": "X") with times in microseconds as the format
requires. An op's name reads `F 3.5` (kind, home pipeline.index) so a re-routed micro-batch is
recognisable at a glance by its home pipeline differing from the track's; `args.rerouted` says so
explicitly and the category `rerouted` lets the viewer filter them.
"""

from __future__ import annotations

from typing import Any

from planner.export._read import failed_workers, grid_size, read_ops

# Reserved colour names of the trace viewer: one per kind so F/B/W/collectives stand apart.
KIND_CNAME = {
    "F": "thread_state_running",
    "B": "rail_response",
    "W": "rail_load",
    "ALLREDUCE": "thread_state_iowait",
    "OPTIMIZER": "yellow",
}
_US_PER_MS = 1000.0


def chrome_trace(timeline: dict[str, Any]) -> dict[str, Any]:
    """The timeline as a Chrome trace event document (`{"traceEvents": [...]}`)."""
    ops = read_ops(timeline)
    pipelines, stages = grid_size(timeline, ops)
    dead = set(failed_workers(timeline))
    workers = sorted({o.worker for o in ops} | dead)
    events: list[dict[str, Any]] = []
    for p in sorted({w[0] for w in workers}):
        events.append({"name": "process_name", "ph": "M", "pid": p, "tid": 0,
                       "args": {"name": f"pipeline {p}"}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": p, "tid": 0,
                       "args": {"sort_index": p}})
    for p, s in workers:
        label = f"worker [{p}, {s}]" + (" failed" if (p, s) in dead else "")
        events.append({"name": "thread_name", "ph": "M", "pid": p, "tid": s, "args": {"name": label}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": p, "tid": s,
                       "args": {"sort_index": s}})
    for op in sorted(ops, key=lambda o: (o.start_ms, o.worker)):
        args: dict[str, Any] = {"worker": list(op.worker)}
        if op.microbatch is None:
            name, cat = op.kind, op.kind
        else:
            name = f"{op.kind} {op.microbatch[0]}.{op.microbatch[1]}"
            cat = f"{op.kind},rerouted" if op.rerouted else op.kind
            args["microbatch"] = list(op.microbatch)
            args["rerouted"] = op.rerouted
        events.append({
            "name": name,
            "cat": cat,
            "ph": "X",
            "ts": round(op.start_ms * _US_PER_MS, 3),
            "dur": round((op.end_ms - op.start_ms) * _US_PER_MS, 3),
            "pid": op.worker[0],
            "tid": op.worker[1],
            "cname": KIND_CNAME[op.kind],
            "args": args,
        })
    return {
        "traceEvents": events,
        "displayTimeUnit": "ms",
        "otherData": {
            "format": timeline.get("format"),
            "pipelines": pipelines,
            "stages": stages,
            "failed": [list(w) for w in sorted(dead)],
            "iteration_ms": timeline.get("iteration_ms"),
            "fault_free_iteration_ms": timeline.get("fault_free_iteration_ms"),
            "lower_bound_ms": timeline.get("lower_bound_ms"),
        },
    }
