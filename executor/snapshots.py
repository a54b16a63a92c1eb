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
    __slots__ = ("layout", "buffers")

    def __init__(self, layout: Any, buffers: list[Tensor]):
        self.layout, self.buffers = layout, buffers

    def rebuild(self, clone: bool) -> Any:
        """The state, its tensors the buffers themselves, or copies of them (`clone`) for a
        consumer that keeps them (an optimizer's `load_state_dict` may keep what it is given)."""
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


def _fits(buffers: list[Tensor], live: list[Tensor]) -> bool:
    return len(buffers) == len(live) and all(
        b.shape == t.shape and b.dtype == t.dtype and b.device == t.device
        for b, t in zip(buffers, live, strict=True))


class SnapshotPool:
    """Takes snapshots, reusing the buffers of released ones (at most one spare set is kept)."""

    def __init__(self) -> None:
        self._spare: list[Tensor] | None = None

    def take(self, state: Any) -> Snapshot:
        live: list[Tensor] = []
        layout = _layout(state, live)
        spare, self._spare = self._spare, None
        buffers = spare if spare is not None and _fits(spare, live) else [torch.empty_like(t) for t in live]
        with torch.no_grad():
            for buffer, tensor in zip(buffers, live, strict=True):
                buffer.copy_(tensor)
        return Snapshot(layout, buffers)

    def release(self, snapshot: Snapshot) -> None:
        """`snapshot` will not be restored: its buffers may hold the next one."""
        self._spare = snapshot.buffers
