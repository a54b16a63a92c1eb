"""Concrete plans built from stored canonical ones, and the per-worker instruction streams, cached.

The store keeps one canonical plan per failure class; a request names concrete workers. Mapping is a
relabelling of pipelines (`CanonicalFailure.to_concrete`), applied to the timeline dict. Streams are
computed per worker from that worker's ops plus the F/B placements on the neighbouring stages only,
so serving one worker of a 512-worker job costs its own ops, not the whole plan's.
"""

from __future__ import annotations

import json
import re
import threading
from collections import OrderedDict
from typing import Any

from planner.failures import normalize
from planner.instructions import instruction_stream_json, stage_transfers
from planner.spec import JobSpec, Worker
from planner.timeline import Op


def failed_key(failed: tuple[Worker, ...]) -> str:
    return ";".join(f"{p}:{s}" for p, s in failed) or "none"


QUICK_PREFIX = "quick "
"""Keys (failure set and class) of a coordinator's quick first plan (`api.quick_plan`) start with this:
the quick plan of a failure set is a plan resource of its own, beside the full solve of its class."""


def quick_key(key: str) -> str:
    return QUICK_PREFIX + key


def is_quick(key: str) -> bool:
    return key.startswith(QUICK_PREFIX)


def parse_failed_key(key: str) -> tuple[Worker, ...]:
    """The failure set of a plan's or class's key (a quick plan's key names the same set)."""
    key = key.removeprefix(QUICK_PREFIX)
    if key == "none":
        return ()
    return tuple((int(p), int(s)) for p, s in (part.split(":") for part in key.split(";")))


def concrete_timeline(job: JobSpec, failed: tuple[Worker, ...],
                      canonical_doc: dict[str, Any]) -> dict[str, Any]:
    """The canonical plan's timeline relabelled onto the concrete failure set `failed`."""
    perm = normalize(job, failed).to_concrete
    if all(c == p for c, p in enumerate(perm)):
        return canonical_doc
    ops = []
    for o in canonical_doc["ops"]:
        op = dict(o)
        op["worker"] = [perm[o["worker"][0]], o["worker"][1]]
        if o.get("microbatch") is not None:
            op["microbatch"] = [perm[o["microbatch"][0]], o["microbatch"][1]]
        ops.append(op)
    ops.sort(key=lambda o: (o["worker"][0], o["worker"][1], o["start_ms"]))
    return {**canonical_doc, "failed": [list(w) for w in failed], "ops": ops}


_SPACE = re.compile(r"[ \t\n\r]*")
_DECODE = json.JSONDecoder().raw_decode


def loads_timeline(text: str) -> dict[str, Any]:
    """`json.loads` of a stored timeline document, its `ops` array decoded one op at a time.

    One `json.loads` of a 64 x 64 x 8 plan (8.7 MB, 98k ops) is one C call holding the GIL for
    0.4 s: every thread of the service, the heartbeat thread too, waited for it when a failure's
    plan was not precomputed. Decoded op by op, the interpreter can switch threads between ops.
    Same result; anything unexpected is left to `json.loads` (which says what is wrong)."""
    try:
        return _loads_in_steps(text)
    except (ValueError, IndexError, KeyError):
        return json.loads(text)


def _loads_in_steps(text: str) -> dict[str, Any]:
    at = _SPACE.match(text, 0).end()
    if text[at] != "{":
        raise ValueError("not an object")
    doc: dict[str, Any] = {}
    at = _SPACE.match(text, at + 1).end()
    while text[at] != "}":
        key, at = _DECODE(text, at)
        at = _SPACE.match(text, at).end()
        if text[at] != ":":
            raise ValueError("no colon")
        at = _SPACE.match(text, at + 1).end()
        if key == "ops" and text[at] == "[":
            value, at = _array_in_steps(text, at + 1)
        else:
            value, at = _DECODE(text, at)
        doc[key] = value
        at = _next_member(text, at, "}")
    if text[_SPACE.match(text, at + 1).end():]:
        raise ValueError("extra data")
    return doc


def _array_in_steps(text: str, at: int) -> tuple[list, int]:
    items: list = []
    at = _SPACE.match(text, at).end()
    while text[at] != "]":
        item, at = _DECODE(text, at)
        items.append(item)
        at = _next_member(text, at, "]")
    return items, at + 1


def _next_member(text: str, at: int, closer: str) -> int:
    """After an object member or array item: the start of the next one, or the `closer`."""
    at = _SPACE.match(text, at).end()
    if text[at] == ",":
        at = _SPACE.match(text, at + 1).end()
        if text[at] == closer:
            raise ValueError("trailing comma")
    elif text[at] != closer:
        raise ValueError("no comma")
    return at


class PlanMaterial:
    """One concrete plan, ready to serve: timeline bytes and an index for instruction streams.

    Built from the stored canonical timeline; the pipeline relabelling is applied while indexing
    the ops (one pass), and the relabelled timeline document is only built when someone asks for
    it: after a failure every worker needs its stream at once, and nobody needs the timeline.
    """

    def __init__(self, job: JobSpec, failed: tuple[Worker, ...], canonical_doc: dict[str, Any]):
        self.job = job
        self.failed = failed
        self._canonical_doc = canonical_doc
        self._doc: dict[str, Any] | None = None
        self._timeline_bytes: bytes | None = None
        self._by_worker: dict[Worker, list[Op]] = {}
        self._fb_at: dict[tuple[str, tuple[int, int], int], Op] = {}
        perm = normalize(job, failed).to_concrete
        for o in canonical_doc["ops"]:
            mb = o.get("microbatch")
            w = o["worker"]
            op = Op((perm[w[0]], w[1]), o["kind"], None if mb is None else (perm[mb[0]], mb[1]),
                    o["start_ms"], o["end_ms"])
            self._by_worker.setdefault(op.worker, []).append(op)
            if op.kind in ("F", "B") and op.microbatch is not None:
                self._fb_at[(op.kind, op.microbatch, op.worker[1])] = op
        self._lock = threading.Lock()
        self._transfers = stage_transfers(job)  # the job's, shared by every stream built here

    @property
    def doc(self) -> dict[str, Any]:
        """The concrete timeline document (relabelled from the canonical one on first use)."""
        if self._doc is None:
            self._doc = concrete_timeline(self.job, self.failed, self._canonical_doc)
        return self._doc

    @property
    def timeline_bytes(self) -> bytes:
        if self._timeline_bytes is None:
            self._timeline_bytes = json.dumps(self.doc, separators=(",", ":")).encode()
        return self._timeline_bytes

    def stream_json(self, worker: Worker) -> bytes:
        """The worker's `InstructionStream` as JSON bytes (the worker must be alive)."""
        own = self._by_worker.get(worker, [])
        s = worker[1]
        near: list[Op] = []
        for op in own:
            if op.microbatch is None or op.kind not in ("F", "B"):
                continue
            for stage in (s - 1, s + 1):
                other = self._fb_at.get((op.kind, op.microbatch, stage))
                if other is not None:
                    near.append(other)
        return instruction_stream_json(self.job, self.failed, own + near, worker, self._transfers)


class MaterialCache:
    """LRU caches of concrete plans (few, large) and streams (many, small). Thread-safe."""

    def __init__(self, plans: int = 6, streams: int = 8192):
        self._plans: OrderedDict[tuple[str, str], PlanMaterial] = OrderedDict()
        self._streams: OrderedDict[tuple[str, str, Worker], bytes] = OrderedDict()
        self._max_plans, self._max_streams = plans, streams
        self._lock = threading.Lock()

    def plan(self, job_id: str, plan_id: str) -> PlanMaterial | None:
        with self._lock:
            found = self._plans.get((job_id, plan_id))
            if found is not None:
                self._plans.move_to_end((job_id, plan_id))
            return found

    def put_plan(self, job_id: str, plan_id: str, material: PlanMaterial) -> None:
        with self._lock:
            self._plans[(job_id, plan_id)] = material
            while len(self._plans) > self._max_plans:
                self._plans.popitem(last=False)

    def stream(self, job_id: str, plan_id: str, worker: Worker) -> bytes | None:
        with self._lock:
            return self._streams.get((job_id, plan_id, worker))

    def put_stream(self, job_id: str, plan_id: str, worker: Worker, data: bytes) -> None:
        with self._lock:
            self._streams[(job_id, plan_id, worker)] = data
            while len(self._streams) > self._max_streams:
                self._streams.popitem(last=False)

    def forget_job(self, job_id: str) -> None:
        with self._lock:
            for key in [k for k in self._plans if k[0] == job_id]:
                del self._plans[key]
            for key in [k for k in self._streams if k[0] == job_id]:
                del self._streams[key]
