"""Turns: callers pass in slices, one slice per event-loop iteration, the rest in later iterations.

After a failure at 4,096 daemons every alive worker's long-poll wakes at once (one event, or the
one future of the streams' fill), and the event loop runs every callback made ready before its
next poll of the sockets: 4,095 answers (29.5 MB) were written in one loop iteration while 4,096
beats/s waited unread - the whole-run heartbeat p99 of 0.42-1.19 s (docs/benchmarks.md). Passing
the answers through `Turns` splits that batch into slices with a poll of the sockets between them,
so beats that arrive meanwhile are read and answered between slices.

A slice ends after `per_turn` callers or once its time budget is used, whichever is first. The
budget is the time the loop spent on everything else since the previous slice (the beats read in
between), at least `budget_s` and at most `max_budget_s`: a loop with time to spare answers
`budget_s` worth per iteration, one that the beats keep busy gives the answers about half of it.
Times are the thread's CPU time, so a process the box deschedules does not lose its slices.
Once a backlog is `hurry_after_s` old (wall time), whatever still waits goes at once: a server that
gets too little CPU to serve the beats and much else (a shared box) would otherwise stretch the
wake-up without bound, because the beats, read every iteration, keep most of each iteration. A
count alone (32 a slice, ~5 ms of answers) let the beats take most of a loaded server: the
4,096 wake-up took 4.7-19 s where all answers at once took 1.4 s. Order is arrival order; a caller
cancelled while waiting gives its place up.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque


class Turns:
    def __init__(self, per_turn: int, budget_s: float = float("inf"), max_budget_s: float | None = None,
                 hurry_after_s: float = float("inf"), clock=time.thread_time, wall=time.monotonic):
        if per_turn < 1:
            raise ValueError("per_turn must be at least 1")
        self.per_turn, self.budget_s, self.clock, self.wall = per_turn, budget_s, clock, wall
        self.hurry_after_s = hurry_after_s
        self.drained = None
        """Optional `(callers, seconds, hurried)`: called when a backlog is over - how many were let
        through while it lasted, how long from its first waiter until the last was let through,
        and how many of them went at once in the hurry (a caller released but then over its
        slice's budget, held back again, counts twice)."""
        self._through = self._hurried = 0
        self.max_budget_s = budget_s if max_budget_s is None else max(budget_s, max_budget_s)
        self._left = per_turn
        self._waiting: deque[asyncio.Future] = deque()
        self._over: list[asyncio.Future] = []
        """Released this turn but over the budget when they ran: first in line for the next."""
        self._slice_started: float | None = None
        self._slice_budget = budget_s
        self._last_pass: float | None = None
        """When the previous slice's last caller went through, while a backlog lasts."""
        self._backlog_since: float | None = None
        """Wall time the current backlog began (someone waiting since)."""
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
        if self._backlog_since is None:
            self._backlog_since = self.wall()
        self._waiting.append(fut)
        self._next_soon()
        while True:
            if await fut or self._within_budget():
                return
            fut = loop.create_future()  # released, but this slice's time is used up
            self._over.append(fut)
            self._next_soon()

    def _within_budget(self) -> bool:
        now = self.clock()
        if self._slice_started is None:
            self._slice_started = now
            other = 0.0 if self._last_pass is None else now - self._last_pass
            self._slice_budget = min(self.max_budget_s, max(self.budget_s, other))
        if now - self._slice_started <= self._slice_budget:
            self._last_pass = now
            return True
        return False

    def _next_soon(self) -> None:
        if not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._next_turn)

    def _next_turn(self) -> None:
        """Runs in the iteration after a slice: a fresh one, given to those waiting first (their
        tasks run in the iteration after this, one slice per iteration); everyone waiting once the
        backlog is `hurry_after_s` old."""
        self._scheduled = False
        hurry = self._backlog_since is not None and self.wall() - self._backlog_since > self.hurry_after_s
        if self._over:
            self._waiting.extendleft(reversed(self._over))
            self._over = []
        self._left = start = len(self._waiting) if hurry else self.per_turn
        self._slice_started = None
        while self._waiting and self._left > 0:
            fut = self._waiting.popleft()
            if not fut.done():  # a cancelled waiter gave its place up
                fut.set_result(hurry)  # hurried: through whatever the budget says
                self._left -= 1
        if self._backlog_since is not None:
            self._through += start - self._left
            if hurry:
                self._hurried += start - self._left
        if self._waiting or self._left < start:
            self._next_soon()
        else:  # nobody waits and nobody was let through: the next backlog starts afresh
            if self._backlog_since is not None and self.drained is not None:
                self.drained(self._through, self.wall() - self._backlog_since, self._hurried)
            self._left, self._through, self._hurried = self.per_turn, 0, 0
            self._last_pass = self._backlog_since = None
