"""Turns: at most N callers pass per event-loop iteration, the rest in later iterations.

After a failure at 4,096 daemons every alive worker's long-poll wakes at once (one event, or the
one future of the streams' fill), and asyncio runs every callback made ready before its next poll
of the sockets: 4,095 answers (29.5 MB) were written in one loop iteration while 4,096 beats/s
waited unread - the whole-run heartbeat p99 of 0.42-1.19 s (docs/benchmarks.md). Passing the
answers through `Turns` splits that batch into slices with a poll of the sockets between them, so
beats that arrive meanwhile are read and answered between slices. Order is arrival order; a
caller cancelled while waiting gives its place up.
"""

from __future__ import annotations

import asyncio
from collections import deque


class Turns:
    def __init__(self, per_turn: int):
        if per_turn < 1:
            raise ValueError("per_turn must be at least 1")
        self.per_turn = per_turn
        self._left = per_turn
        self._waiting: deque[asyncio.Future] = deque()
        self._scheduled = False

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    async def take(self) -> None:
        """Return in this iteration if this iteration's share is not used up (and nobody waits),
        else in a later one."""
        if self._left > 0 and not self._waiting:
            self._left -= 1
            self._next_soon()
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiting.append(fut)
        self._next_soon()
        await fut

    def _next_soon(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """Runs in the iteration after a share was used: a fresh share, given to those waiting
        first (their tasks run in the iteration after this, one slice per iteration)."""
        self._scheduled = False
        self._left = self.per_turn
        while self._waiting and self._left > 0:
            fut = self._waiting.popleft()
            if not fut.done():  # a cancelled waiter gave its place up
                fut.set_result(None)
                self._left -= 1
        if self._left < self.per_turn:
            self._next_soon()
