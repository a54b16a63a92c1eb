"""Who solves next: `solver_processes` slots, handed out by priority, fairly across jobs, with a
bounded client queue.

Priorities, most urgent first: a coordinator re-plan whose workers hold no assignment yet (URGENT,
alias COORDINATOR), a coordinator re-plan that improves the quick plan workers already run (IMPROVE),
client solves (CLIENT), precompute (PRECOMPUTE). So a re-plan of *any* job goes ahead of every
client solve. Within one priority the job served least recently goes first, then first come: one
job re-planning again and again (a churning failure set) cannot starve another job's first
assignment. Only client solves can be refused: when `max_queued` of them already wait, the next one
gets `QueueFull` (503 + Retry-After). Coordinator solves are never refused; precompute keeps at most
`solver_processes` solves in flight by itself.
"""

from __future__ import annotations

import asyncio
import itertools
from dataclasses import dataclass, field

URGENT, IMPROVE, CLIENT, PRECOMPUTE = 0, 1, 2, 3
COORDINATOR = URGENT

SERVED_REMEMBERED = 4096
"""Jobs whose last grant is remembered for fairness (the oldest is forgotten first: a job not
served for that many grants counts as never served, which only moves it ahead)."""


class QueueFull(Exception):  # noqa: N818 - reads as what happened
    def __init__(self, waiting: int, limit: int):
        super().__init__(f"the solve queue is full ({waiting} client solves waiting, limit {limit}: "
                         "RECYCLE_MAX_QUEUED_SOLVES); retry later")
        self.waiting, self.limit = waiting, limit


@dataclass
class _Waiter:
    priority: int
    seq: int
    gate: asyncio.Future = field(compare=False)
    token: object = field(compare=False)
    group: object = field(compare=False, default=None)


class SolveQueue:
    def __init__(self, slots: int, max_queued: int):
        self.free, self.max_queued = slots, max_queued
        self._waiting: list[_Waiter] = []
        self._seq = itertools.count()
        self._grants = itertools.count()
        self._served: dict[object, int] = {}
        """Job -> number of the grant it last got (insertion order = oldest first)."""

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

    def priority_of(self, token: object) -> int | None:
        """The priority a queued solve waits at; None once it runs (or was never queued)."""
        return next((w.priority for w in self._waiting if w.token is token), None)

    async def acquire(self, priority: int, token: object, group: object = None) -> None:
        """Wait for a slot (most urgent first, then the job served least recently, then first come);
        `token` names the solve for `promote`, `group` the job it is for."""
        if self.free > 0 and not self._waiting:
            self.free -= 1
            self._grant(group)
            return
        waiter = _Waiter(priority, next(self._seq), asyncio.get_running_loop().create_future(), token, group)
        self._waiting.append(waiter)
        try:
            await waiter.gate
        except asyncio.CancelledError:
            if waiter in self._waiting:
                self._waiting.remove(waiter)
            elif waiter.gate.done() and not waiter.gate.cancelled():
                self.release()  # the slot was handed to us as we were cancelled: pass it on
            raise

    def _order(self, w: _Waiter) -> tuple[int, int, int]:
        return w.priority, self._served.get(w.group, -1), w.seq

    def _grant(self, group: object) -> None:
        self._served.pop(group, None)  # re-inserted last: the most recently served
        self._served[group] = next(self._grants)
        if len(self._served) > SERVED_REMEMBERED:
            self._served.pop(next(iter(self._served)))

    def release(self) -> None:
        while self._waiting:
            waiter = min(self._waiting, key=self._order)
            self._waiting.remove(waiter)
            if not waiter.gate.done():
                self._grant(waiter.group)
                waiter.gate.set_result(None)
                return
        self.free += 1
