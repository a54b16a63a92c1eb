"""Turns: callers pass in slices, one slice per event-loop iteration, the rest in later iterations.

After a failure at 4,096 daemons every alive worker's long-poll wakes at once (one event, or the
one future of the streams' fill), and the event loop runs every callback made ready before its
next poll of the sockets: 4,095 answers (29.5 MB) were written in one loop iteration while 4,096
beats/s waited unread - the whole-run heartbeat p99 of 0.42-1.19 s (docs/benchmarks.md). Passing
the answers through `Turns` splits that batch into slices with a poll of the sockets between them,
so beats that arrive meanwhile are read and answered between slices.

A slice ends after `per_turn` callers or once `budget_s` has passed since its first caller went
through, whichever is first: a count alone made each slice ~5 ms of answers while the beats
read between slices grew with the box's load, and the wake-up took 4.7-19 s at 4,096 daemons
where all of it at once took 1.4 s. Order is arrival order; a caller cancelled while waiting gives
its place up.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque


class Turns:
    def __init__(self, per_turn: int, budget_s: float = float("inf"), clock=time.perf_counter):
        if per_turn < 1:
            raise ValueError("per_turn must be at least 1")
        self.per_turn, self.budget_s, self.clock = per_turn, budget_s, clock
        self._left = per_turn
        self._waiting: deque[asyncio.Future] = deque()
        self._over: list[asyncio.Future] = []
        """Released this turn but over the budget when they ran: first in line for the next."""
        self._slice_started: float | None = None
        self._scheduled = False

    @property
    def waiting(self) -> int:
        return len(self._waiting) + len(self._over)

    async def take(self) -> None:
        """Return in this iteration if this iteration's slice is not used up (and nobody waits),
        else in a later one."""
        if self._left > 0 and not self.waiting and self._within_budget():
            self._left -= 1
            self._next_soon()
            return
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        self._waiting.append(fut)
        self._next_soon()
        while True:
            await fut
            if self._within_budget():
                return
            fut = loop.create_future()  # released, but this slice's time is used up
            self._over.append(fut)
            self._next_soon()

    def _within_budget(self) -> bool:
        now = self.clock()
        if self._slice_started is None:
            self._slice_started = now
        return now - self._slice_started <= self.budget_s

    def _next_soon(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """Runs in the iteration after a slice: a fresh one, given to those waiting first (their
        tasks run in the iteration after this, one slice per iteration)."""
        self._scheduled = False
        self._left = self.per_turn
        self._slice_started = None
        if self._over:
            self._waiting.extendleft(reversed(self._over))
            self._over = []
        while self._waiting and self._left > 0:
            fut = self._waiting.popleft()
            if not fut.done():  # a cancelled waiter gave its place up
                fut.set_result(None)
                self._left -= 1
        if self._left < self.per_turn:
            self._next_soon()
