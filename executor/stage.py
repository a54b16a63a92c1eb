"""One stage's compute for a stream of micro-batches: F, then B (input gradient), then W.

F runs the stage forward with a fresh `WeightGradStore` and keeps the graph. B runs autograd from
the stage output to the stage input only: every learnable op's backward returns the activation
gradient and records its weight-gradient GEMM in the store, so B never touches a weight gradient,
and the graph (with everything B needed) is freed when B ends. W runs the recorded GEMMs: it
needs only the layer inputs and output gradients the store holds, never the graph. On stage 0
there is no input gradient to produce (token ids), so B carries the gradient through the stage's
blocks down to the embedding and W does the rest.

The loss of a micro-batch is scaled by `loss_scale` (1 / (D x M)) before B, so summing the weight
gradients of all D x M micro-batches across the stage's replicas gives the gradient of the mean
loss over the global batch whichever worker ran which micro-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from executor.model import StageModule
from executor.split_backward import WeightGradStore

Microbatch = tuple[int, int]
"""(home pipeline, index) within one iteration."""


@dataclass
class _InFlight:
    input: Tensor | None
    output: Tensor
    store: WeightGradStore


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


class StageRunner(IterationBook):
    def __init__(self, module: StageModule, loss_scale: float):
        self.module = module
        self.loss_scale = loss_scale
        self._forwarded: dict[Microbatch, _InFlight] = {}
        self._awaiting_w: dict[Microbatch, WeightGradStore] = {}
        self.losses: dict[Microbatch, float] = {}
        """Unscaled loss of each micro-batch this (last) stage ran in the current iteration."""

    @property
    def first(self) -> bool:
        return self.module.first

    @property
    def last(self) -> bool:
        return self.module.last

    def forward(self, mb: Microbatch, x: Tensor, targets: Tensor | None = None) -> Tensor:
        """F. `x`: token ids on stage 0, else the received activation. Returns the activation to
        send (a detached copy), or on the last stage the loss (a detached scalar)."""
        if mb in self._forwarded or mb in self._awaiting_w:
            raise StageError(f"F of micro-batch {list(mb)} twice in one iteration")
        inp = None if self.first else x.detach().requires_grad_(True)
        store = WeightGradStore()
        out = self.module(x if self.first else inp, targets, store)
        if self.last:
            self.losses[mb] = float(out.detach())
            out = out * self.loss_scale
        self._forwarded[mb] = _InFlight(inp, out, store)
        return out.detach()

    def backward_input(self, mb: Microbatch, grad_output: Tensor | None = None) -> Tensor | None:
        """B. `grad_output`: the received gradient of this stage's output (None on the last
        stage, whose output is the loss). Returns the gradient to send upstream (None on stage 0)."""
        state = self._forwarded.pop(mb, None)
        if state is None:
            raise StageError(f"B of micro-batch {list(mb)} without a pending F")
        if self.last:
            grad_output = None
        elif grad_output is None:
            raise StageError(f"B of micro-batch {list(mb)} needs the output gradient")
        if self.first:
            # Nothing upstream: propagate to the embedding so its (deferred) weight work exists.
            state.output.backward(grad_output)
            grad_input = None
        else:
            (grad_input,) = torch.autograd.grad(state.output, state.input, grad_output)
        self._awaiting_w[mb] = state.store
        return grad_input

    def backward_weight(self, mb: Microbatch) -> None:
        """W: accumulate this micro-batch's weight gradients into `param.grad`."""
        store = self._awaiting_w.pop(mb, None)
        if store is None:
            raise StageError(f"W of micro-batch {list(mb)} without a finished B")
        store.flush()
