"""Rollback snapshots of a stage replica's state, copied into buffers that are reused.

A worker snapshots its parameters and optimizer state before every optimizer step, so that it can
return to that state when a failure makes the job rerun an iteration it already stepped
(docs/design.md, "Recovery by iteration rollback"). Copying into fresh tensors each time cost more
than the step itself on the CPU (a 4.9 M-parameter GPT stage with AdamW: 12-26 ms a snapshot, the
new memory page-faulted in each time, against 5 ms into tensors that already exist), so the buffers
of a snapshot that is no longer needed hold the next one.

A snapshot is the state's nested structure with every tensor replaced by a `_Slot` (its index
into the buffers), and the buffers. Non-tensor values (hyper-parameters, step counts kept as
numbers) are deep-copied into the structure.

On a GPU the buffers are pinned host memory (`host_memory`), filled on a side stream: two sets of a
stage's parameters and AdamW state would otherwise take six times the parameters' bytes of GPU
memory, and the copy overlaps the next iteration's compute instead of delaying the step. The worker
takes the snapshot right after a step (the state before the next one), and the device waits for the
copy only before the state changes again (`Snapshot.before_change`). A module buffer that forwards
update in place (a batch norm's running statistics) may be copied before or after the next
iteration's first forwards; parameters and optimizer state only change in the step.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor


class _Slot:
    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


class Snapshot:
    __slots__ = ("layout", "buffers", "ready", "device")

    def __init__(self, layout: Any, buffers: list[Tensor], ready: Any = None, device: Any = None):
        self.layout, self.buffers = layout, buffers
        self.ready = ready
        """The CUDA event recorded after the copy on the side stream; None: copied already."""
        self.device = device
        """The GPU whose state was copied (with `ready`)."""

    def before_change(self) -> None:
        """Call before the state it copies changes in place: the device waits for the copy to have
        read it (the host does not wait)."""
        if self.ready is not None:
            torch.cuda.current_stream(self.device).wait_event(self.ready)

    def wait(self) -> None:
        """The host waits until the buffers hold the state: before reading them, or before the
        state's tensors are replaced (freed memory the copy may still be reading)."""
        if self.ready is not None:
            self.ready.synchronize()
            self.ready = None

    def rebuild(self, clone: bool) -> Any:
        """The state, its tensors the buffers themselves, or copies of them (`clone`) for a
        consumer that keeps them (an optimizer's `load_state_dict` may keep what it is given)."""
        self.wait()
        return _fill(self.layout, self.buffers, clone)


def _layout(value: Any, live: list[Tensor]) -> Any:
    if isinstance(value, Tensor):
        live.append(value)
        return _Slot(len(live) - 1)
    if isinstance(value, dict):
        return {k: _layout(v, live) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_layout(v, live) for v in value)
    return copy.deepcopy(value)


def _fill(layout: Any, buffers: list[Tensor], clone: bool) -> Any:
    if isinstance(layout, _Slot):
        return buffers[layout.index].clone() if clone else buffers[layout.index]
    if isinstance(layout, dict):
        return {k: _fill(v, buffers, clone) for k, v in layout.items()}
    if isinstance(layout, list | tuple):
        return type(layout)(_fill(v, buffers, clone) for v in layout)
    return layout


class SnapshotPool:
    """Takes snapshots, reusing the buffers of released ones (at most one spare set is kept)."""

    def __init__(self, host_memory: bool = False) -> None:
        self.host_memory = host_memory
        """Keep a GPU tensor's copy in pinned host memory, filled on a side stream."""
        self._spare: list[Tensor] | None = None
        self._streams: dict[torch.device, Any] = {}

    def _buffer_for(self, tensor: Tensor) -> Tensor:
        if self.host_memory and tensor.is_cuda:
            return torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=True)
        return torch.empty_like(tensor)

    def _fits(self, buffers: list[Tensor], live: list[Tensor]) -> bool:
        return len(buffers) == len(live) and all(
            b.shape == t.shape and b.dtype == t.dtype
            and b.device == (torch.device("cpu") if self.host_memory and t.is_cuda else t.device)
            for b, t in zip(buffers, live, strict=True))

    def take(self, state: Any) -> Snapshot:
        live: list[Tensor] = []
        layout = _layout(state, live)
        spare, self._spare = self._spare, None
        if spare is None or not self._fits(spare, live):
            spare = [self._buffer_for(t) for t in live]
        buffers = spare
        device = next((t.device for t in live if t.is_cuda), None) if self.host_memory else None
        if device is None:
            with torch.no_grad():
                for buffer, tensor in zip(buffers, live, strict=True):
                    buffer.copy_(tensor)
            return Snapshot(layout, buffers)
        stream = self._streams.get(device)
        if stream is None:
            stream = self._streams[device] = torch.cuda.Stream(device)
        # The copy starts after the work already queued (the step that made this state); a buffer
        # released by an earlier snapshot is rewritten only after that copy, on the same stream.
        stream.wait_stream(torch.cuda.current_stream(device))
        with torch.no_grad(), torch.cuda.stream(stream):
            for buffer, tensor in zip(buffers, live, strict=True):
                buffer.copy_(tensor, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(stream)
        return Snapshot(layout, buffers, ready, device)

    def release(self, snapshot: Snapshot) -> None:
        """`snapshot` will not be restored: its buffers may hold the next one."""
        self._spare = snapshot.buffers
