"""A worker's receives for one iteration, posted in each sender's order.

NCCL matches a pair's messages in the order they were sent and ignores tags, so a receive posted
for micro-batch X gets whatever that peer sent next. A plan may have a worker consume two
micro-batches from one peer in another order than the peer produced them (any order that keeps the
contract's rules is valid), so receives cannot simply be posted in the order the worker needs them.
Each RECV instruction carries `seq`, its place in the sender's order on that channel (one channel
per ordered pair of workers: stages differ by one, so it carries activations or gradients, never
both); receives are posted channel by channel in that order, and a message that arrives before it
is needed waits in its buffer. gloo runs the same way (one tag per tensor kind, FIFO per peer and
tag: `executor/comms.py`), so the CPU tests run the GPU's matching.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from planner.instructions import Instruction

Key = tuple[tuple[int, int], str]
"""A received message by what it is: (micro-batch, tensor kind); unique within one iteration."""


class Receives:
    """The RECV instructions of one worker's iteration, posted ahead (`prefetch`, at most about
    `window` outstanding) and handed out when the stream needs each (`take`).

    `post(ins, block)` posts one receive and returns its handle, or None when its buffer cannot be
    made yet and `block` is False (the sender's output signature is not published)."""

    def __init__(self, recvs: list[Instruction], post: Callable[[Instruction, bool], Any | None],
                 window: int):
        self._needed = recvs
        self._post, self._window = post, window
        channels: dict[tuple, list[tuple[int, int, Instruction]]] = {}
        for position, ins in enumerate(recvs):
            assert ins.peer is not None and ins.tensor is not None and ins.microbatch is not None
            # A stream without `seq` (an older service) keeps its own order: right where the
            # plan is FIFO on every channel, as every plan was before the field existed.
            order = ins.seq if ins.seq is not None else position
            channels.setdefault((tuple(ins.peer), ins.tensor.value), []).append((order, position, ins))
        self._lanes = {name: [ins for _, _, ins in sorted(entries, key=lambda e: e[:2])]
                       for name, entries in channels.items()}
        """Per channel (peer, tensor kind): its receives in the sender's order."""
        self._place: dict[Key, tuple[tuple, int]] = {
            _key(ins): (name, i) for name, lane in self._lanes.items() for i, ins in enumerate(lane)}
        self._posted_in = dict.fromkeys(self._lanes, 0)
        """Per channel: how many of its receives are posted."""
        self._posted: dict[Key, Any] = {}
        self._next = 0

    @property
    def outstanding(self) -> int:
        """Receives posted and not yet taken."""
        return len(self._posted)

    def _post_through(self, ins: Instruction, block: bool) -> bool:
        """Post every receive of `ins`'s channel up to and including it, in the sender's order."""
        name, index = self._place[_key(ins)]
        while self._posted_in[name] <= index:
            nxt = self._lanes[name][self._posted_in[name]]
            handle = self._post(nxt, block)
            if handle is None:
                return False
            self._posted[_key(nxt)] = handle
            self._posted_in[name] += 1
        return True

    def prefetch(self) -> None:
        """Post ahead, in the order the stream needs the messages, while fewer than `window` wait."""
        while self._next < len(self._needed) and len(self._posted) < self._window:
            ins = self._needed[self._next]
            name, index = self._place[_key(ins)]
            if self._posted_in[name] <= index and not self._post_through(ins, block=False):
                return
            self._next += 1

    def take(self, ins: Instruction) -> Any:
        """The handle of `ins`'s receive, posting it (and its channel's earlier ones) if needed."""
        if _key(ins) not in self._posted:
            self._post_through(ins, block=True)
        return self._posted.pop(_key(ins))


def _key(ins: Instruction) -> Key:
    assert ins.microbatch is not None and ins.tensor is not None
    return (tuple(ins.microbatch), ins.tensor.value)
