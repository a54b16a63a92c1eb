"""Who solves next: `solver_processes` slots, handed out by priority, with a bounded client queue.

Coordinator re-plans (workers are waiting on them) go ahead of every client solve, and client solves
ahead of precompute. Only client solves can be refused: when `max_queued` of them already wait, the
next one gets `QueueFull` (503 + Retry-After). Coordinator solves are never refused; precompute keeps
at most `solver_processes` solves in flight by itself.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

COORDINATOR, CLIENT, PRECOMPUTE = 0, 1, 2


class QueueFull(Exception):  # noqa: N818 - reads as what happened
    def __init__(self, waiting: int, limit: int):
        super().__init__(f"the solve queue is full ({waiting} client solves waiting, limit {limit}: "
                         "RECYCLE_MAX_QUEUED_SOLVES); retry later")
        self.waiting, self.limit = waiting, limit


@dataclass(order=True)
class _Waiter:
    priority: int
    seq: int
    gate: asyncio.Future = field(compare=False)
    token: object = field(compare=False)


class SolveQueue:
    def __init__(self, slots: int, max_queued: int):
        self.free, self.max_queued = slots, max_queued
        self._waiting: list[_Waiter] = []
        self._seq = itertools.count()

    def waiting(self, priority: int | None = None) -> int:
        return sum(1 for w in self._waiting if priority is None or w.priority == priority)

    def check(self, priority: int) -> None:
        """Raise `QueueFull` if a new solve of this priority would have to wait and may not."""
        if priority == CLIENT and self.free <= 0:
            waiting = self.waiting(CLIENT)
            if waiting >= self.max_queued:
                raise QueueFull(waiting, self.max_queued)

    def promote(self, token: object, priority: int) -> None:
        """A solve already queued is now wanted by someone more urgent (e.g. the coordinator)."""
        for w in self._waiting:
            if w.token is token and priority < w.priority:
                w.priority = priority

    async def acquire(self, priority: int, token: object) -> None:
        """Wait for a slot (most urgent first, then first come); `token` names the solve for `promote`."""
        if self.free > 0 and not self._waiting:
            self.free -= 1
            return
        waiter = _Waiter(priority, next(self._seq), asyncio.get_running_loop().create_future(), token)
        self._waiting.append(waiter)
        try:
            await waiter.gate
        except asyncio.CancelledError:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
            elif waiter.gate.done() and not waiter.gate.cancelled():
                self.release()  # the slot was handed to us as we were cancelled: pass it on
            raise

    def release(self) -> None:
        while self._waiting:
            waiter = min(self._waiting)
            self._waiting.remove(waiter)
            if not waiter.gate.done():
                waiter.gate.set_result(None)
                return
        self.free += 1
