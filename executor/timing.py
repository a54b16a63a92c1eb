"""Per-op timing that is true on both devices.

On CPU an op has finished when its Python call returns, so `time.perf_counter` around it is its
time. CUDA kernels run asynchronously: the call returns once they are queued, so the same wall clock
would measure the launch, not the work. On CUDA each op is bracketed by a pair of CUDA events on the
current stream, and the elapsed times are read once per iteration (`flush`, which synchronizes on
the last event) rather than after every op, so timing never serializes the pipeline.
"""

from __future__ import annotations

import time
from typing import Any

import torch


class OpTimer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.seconds: dict[str, float] = {}
        self._pending: list[tuple[str, Any, Any]] = []

    def start(self) -> Any:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def stop(self, op: str, started: Any) -> None:
        if self.cuda:
            end = torch.cuda.Event(enable_timing=True)
            end.record()
            self._pending.append((op, started, end))
            return
        self.seconds[op] = self.seconds.get(op, 0.0) + time.perf_counter() - started

    def flush(self) -> None:
        """Add the CUDA ops timed since the last flush (waits for the last of them)."""
        if not self._pending:
            return
        self._pending[-1][2].synchronize()
        for op, start, end in self._pending:
            self.seconds[op] = self.seconds.get(op, 0.0) + start.elapsed_time(end) / 1e3
        self._pending.clear()
