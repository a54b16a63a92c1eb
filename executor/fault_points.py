"""Fault injection: the one seam through which a launcher stops a worker at an exact point.

Production workers never build it: `recycle worker` has no pause or hold points, so `FaultPoints.of`
returns None and the training loop runs without a single check. The local cluster (`recycle train
--kill/--rejoin`, the demo, tests, `benchmarks/executor_recovery.py`) asks a worker to

- announce itself at "ITER:PHASE" and wait there (bounded), so the launcher's SIGKILL lands exactly
  in that phase of that iteration (`pause`, before the middle occurrence of the phase's op);
- hold at a rejoin's iteration boundary until the rejoiner's generation arrives (`hold`), so the
  rejoin happens at the iteration the user named and not whenever the restarted process got ready.

Both sides speak through the job's c10d store, with the keys built here and nowhere else.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

PHASES = {"forward": "F", "backward_input": "B", "backward_weight": "W", "allreduce": "ALLREDUCE",
          "optimizer": "OPTIMIZER"}
"""Fault-injection phase names and the instruction each one pauses before (its middle occurrence)."""


def reached_key(worker: tuple[int, int]) -> str:
    return f"reached/{worker[0]}:{worker[1]}"


def release_key(worker: tuple[int, int], point: str) -> str:
    return f"release/{worker[0]}:{worker[1]}/{point}"


def hold_release_key(iteration: int) -> str:
    return f"release-hold/{iteration}"


def record_key(iteration: int, worker: tuple[int, int]) -> str:
    """Where a worker posts when it finished `iteration` (the launcher's copy, kept if it dies)."""
    return f"record/{iteration}/{worker[0]}:{worker[1]}"


def generation_key(generation: int, worker: tuple[int, int]) -> str:
    """Where a worker posts how it started `generation` (likewise kept if it dies)."""
    return f"generation/{generation}/{worker[0]}:{worker[1]}"


def pause_positions(ops: Sequence[str]) -> dict[int, str]:
    """Instruction index -> phase name: the middle occurrence of each phase's op in a stream."""
    positions = {}
    for phase, op in PHASES.items():
        where = [i for i, name in enumerate(ops) if name == op]
        if where:
            positions[where[len(where) // 2]] = phase
    return positions


class FaultPoints:
    """A worker's side of the seam: its pause points ("ITER:PHASE") and rejoin holds [ITER, P, S]."""

    def __init__(self, store: Any, worker: tuple[int, int], pause_at: list[str],
                 hold_at: list[list[int]], timeout_s: float, interrupted: threading.Event):
        self.store, self.worker = store, worker
        self.pause_at, self.hold_at = set(pause_at), hold_at
        self.timeout_s = timeout_s
        self.interrupted = interrupted
        """Set when a newer generation arrived: a hold ends at once (the rejoiner is here)."""
        self.held: set[int] = set()

    @classmethod
    def of(cls, store: Any, worker: tuple[int, int], pause_at: list[str], hold_at: list[list[int]],
           timeout_s: float, interrupted: threading.Event) -> FaultPoints | None:
        if not pause_at and not hold_at:
            return None
        return cls(store, worker, pause_at, hold_at, timeout_s, interrupted)

    def pause(self, iteration: int, phase: str) -> None:
        """Announce reaching a phase the launcher asked about, and wait (bounded) to be released."""
        point = f"{iteration}:{phase}"
        if point not in self.pause_at:
            return
        self.store.set(reached_key(self.worker), point)
        self._wait(release_key(self.worker, point), None)

    def holds(self, failed: set[tuple[int, int]]) -> set[int]:
        """Iterations to hold at under a generation whose failed workers are `failed`: those where a
        still-failed worker is due to rejoin."""
        return {it for it, p, s in self.hold_at if (p, s) in failed} - self.held

    def hold(self, iteration: int) -> bool:
        """Wait at this iteration boundary until the launcher releases it or the bound passes.
        True: a newer generation arrived meanwhile (the caller stops running this one)."""
        self.held.add(iteration)
        return self._wait(hold_release_key(iteration), self.interrupted)

    def _wait(self, key: str, interrupted: threading.Event | None) -> bool:
        deadline = time.monotonic() + self.timeout_s
        while not self.store.check([key]) and time.monotonic() < deadline:
            if interrupted is not None and interrupted.is_set():
                return True
            time.sleep(0.01)
        return False
