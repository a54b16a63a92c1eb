"""Assignment and heartbeat answers as bytes, serialized once per generation and spliced per worker.

After a failure every alive worker of the job long-polls the same generation at once: the part of
the answer they share (status, failure set, the job's shape - not the alive list, which the worker
derives; docs/design.md) is serialized once, and each worker's answer is that head with its own
`worker` and its cached instruction stream (already JSON bytes) spliced in, never parsed and
serialized again.
"""

from __future__ import annotations

import json

from api.membership import Membership
from planner.spec import Worker


def _dumps(doc: dict) -> bytes:
    return json.dumps(doc, separators=(",", ":")).encode()


def _splice(head: bytes, worker: Worker, tail: bytes) -> bytes:
    """`head` (a JSON object) with `"worker": [p, s]` and `tail` (further `,"key":value` members)."""
    return b"%s,\"worker\":[%d,%d]%s}" % (head[:-1], worker[0], worker[1], tail)


class Payload:
    """One settled generation's assignment answers."""

    def __init__(self, job_id: str, m: Membership):
        self.job_id, self.generation, self.plan_id = job_id, m.generation, m.plan_id
        self.head = _dumps(m.assignment_head(job_id))
        self.excluded_head = _dumps(m.assignment_head(job_id, excluded=True))
        """Shared by the failed workers too: built per answer it was O(failures) each, O(failures^2)
        for a generation after a mass failure (13 % of the server in such a run, py-spy)."""
        self.streams: dict[Worker, bytes] = {}
        """Instruction streams of this generation's plan, filled before its answers go out."""

    def body(self, m: Membership, worker: Worker) -> bytes:
        """The worker's answer: `excluded` when failed, else the shared head with its stream (or
        `null` instructions when the generation runs nothing, e.g. `waiting`)."""
        if worker in m.failed:
            return _splice(self.excluded_head, worker, b',"instructions":null')
        instructions = self.streams.get(worker, b"null") if m.streamed(worker) else b"null"
        return _splice(self.head, worker, b',"instructions":' + instructions)


class StateBytes:
    """The membership state a heartbeat answers, serialized once per change of the state."""

    def __init__(self) -> None:
        self._cached: tuple[tuple | None, bytes] = (None, b"")
        """(state key, head): one attribute, replaced whole, as the heartbeat thread reads it too."""

    def body(self, job_id: str, m: Membership, worker: Worker) -> bytes:
        key = (m.generation, m.status, m.plan_id, m.reason, m.iteration_ms)
        cached_key, head = self._cached
        if key != cached_key:
            head = _dumps(m.state(job_id))
            self._cached = (key, head)
        excluded = b"true" if worker in m.failed else b"false"
        return _splice(head, worker, b',"excluded":' + excluded)
