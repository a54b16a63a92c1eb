"""What every stage runner does between micro-batches of an iteration: count, forget and reset the
in-flight work, and give a replica that ran nothing zero gradients for the all-reduce."""

from __future__ import annotations

import torch


class StageError(RuntimeError):
    """An op out of order for a micro-batch (a plan or runtime bug, never silently ignored)."""


class IterationBook:
    """What every stage runner does between micro-batches: count, forget and reset the in-flight
    work of an iteration (subclasses keep `_forwarded`, `_awaiting_w`, `losses`, `module`)."""

    def pending(self) -> int:
        return len(self._forwarded) + len(self._awaiting_w)

    def drop_in_flight(self) -> None:
        """Forget every micro-batch of an interrupted iteration (its graphs, deferred weight work,
        losses and partial gradients): the iteration is rerun from scratch under the next plan."""
        self._forwarded.clear()
        self._awaiting_w.clear()
        self.losses.clear()
        for p in self.module.parameters():
            p.grad = None

    def start_iteration(self) -> None:
        if self.pending():
            raise StageError(f"{self.pending()} micro-batches still in flight at an iteration boundary")
        self.losses.clear()
        for p in self.module.parameters():
            p.grad = None

    def ensure_grads(self) -> None:
        """Zero-filled gradients for parameters that got none (a replica that ran no micro-batch
        still joins the all-reduce with the same buffer layout)."""
        for p in self.module.parameters():
            if p.grad is None:
                p.grad = torch.zeros_like(p)
