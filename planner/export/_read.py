"""Reading a `recycle.timeline/v1` dict for the exporters.

The exporters take the contract dict (stored JSON, or `PlanResult.timeline_json()`) rather than the
planner's objects, so the API can run them on what it stored. A 32 x 16 x 64 plan has ~100k ops, so
this reads the planner's one op type, the light `Op` record, instead of pydantic models, and
reports a malformed op by index.
"""

from __future__ import annotations

from typing import Any

from planner.timeline import COMPUTE_KINDS, Op, OpKind

KINDS = tuple(k.value for k in OpKind)


def read_ops(timeline: Any) -> list[Op]:
    """The timeline's ops as the planner's own `Op`; ValueError names the first malformed op."""
    if not isinstance(timeline, dict):
        raise ValueError("timeline: expected a JSON object (recycle.timeline/v1)")
    ops = timeline.get("ops")
    if not isinstance(ops, list):
        raise ValueError("timeline.ops: expected a list of ops")
    out: list[Op] = []
    append = out.append
    for i, op in enumerate(ops):
        try:
            p, s = op["worker"]
            kind = op["kind"]
            mb = op.get("microbatch")
            home, index = (None, None) if mb is None else (int(mb[0]), int(mb[1]))
            start, end = float(op["start_ms"]), float(op["end_ms"])
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"timeline.ops[{i}]: malformed op {op!r} ({exc})") from None
        if kind not in KINDS:
            raise ValueError(f"timeline.ops[{i}]: unknown kind {kind!r} (expected one of {KINDS})")
        if kind in COMPUTE_KINDS and home is None:
            raise ValueError(f"timeline.ops[{i}]: {kind} op without a microbatch")
        append(Op((int(p), int(s)), kind, None if home is None else (home, index), start, end))
    return out


def grid_size(timeline: dict[str, Any], ops: list[Op]) -> tuple[int, int]:
    """(pipelines, stages) from the job spec, or from the ops when the job lacks them."""
    job = timeline.get("job") if isinstance(timeline.get("job"), dict) else {}
    pipelines = job.get("pipelines")
    stages = job.get("stages")
    if not isinstance(pipelines, int) or not isinstance(stages, int):
        pipelines = 1 + max((o.worker[0] for o in ops), default=0)
        stages = 1 + max((o.worker[1] for o in ops), default=0)
    return pipelines, stages


def failed_workers(timeline: dict[str, Any]) -> list[tuple[int, int]]:
    failed = timeline.get("failed") or []
    try:
        return sorted((int(p), int(s)) for p, s in failed)
    except (TypeError, ValueError):
        raise ValueError(f"timeline.failed: expected a list of [pipeline, stage], got {failed!r}") from None

