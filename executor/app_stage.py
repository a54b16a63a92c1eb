"""One stage of a user's training app: F, B (input gradient) and W (weight gradient) per micro-batch,
the wire format of activations and gradients, and the replica state for rollback and rejoin.

Stage inputs and outputs may be a tensor or a tuple of tensors of any shape and dtype. A transfer
is one message: the tensors' bytes back to back (`pack`), read with the sender's signature
(`unpack`): a list of (shape, dtype). Every micro-batch of a job has the same shapes (items are
collated `microbatch_size` at a time), so a stage's output signature is published once in the c10d
store after its first F (`SignatureBook`) and receive buffers are sized from it. Gradients travel
for the floating-point tensors only (an integer tensor, e.g. token ids passed along, has none); a
float input that got no gradient sends zeros.

The loss of a micro-batch is scaled by `loss_scale` (1 / (D x M)) before B, so the stage's summed
gradients over all replicas are the gradient of the mean loss over the global batch whichever
worker ran which micro-batch (contracts.md, "Training app").
"""

from __future__ import annotations

import io
import json
from typing import Any

import torch
from torch import Tensor

from executor.app import TrainingApp, as_tuple, call_stage
from executor.autograd_split import PendingWeightGrad, backward_input, backward_weight
from executor.deferred_modules import MicrobatchWeights, WeightRecorder, swap_weight_layers, used_elsewhere
from executor.iteration_book import IterationBook, StageError
from executor.snapshots import Snapshot, SnapshotPool

Microbatch = tuple[int, int]
Signature = list[tuple[tuple[int, ...], torch.dtype]]


def signature_of(tensors: tuple[Tensor, ...]) -> Signature:
    return [(tuple(t.shape), t.dtype) for t in tensors]


def gradient_signature(signature: Signature) -> Signature:
    return [(shape, dtype) for shape, dtype in signature if dtype.is_floating_point]


def nbytes(signature: Signature) -> int:
    return sum(torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
               for shape, dtype in signature)


def pack(tensors: list[Tensor] | tuple[Tensor, ...]) -> Tensor:
    return torch.cat([t.detach().contiguous().reshape(-1).view(torch.uint8) for t in tensors])


def unpack(buffer: Tensor, signature: Signature) -> tuple[Tensor, ...]:
    out, offset = [], 0
    for shape, dtype in signature:
        size = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        # clone: a slice's storage offset may not be aligned for the wider dtype
        out.append(buffer[offset : offset + size].clone().view(dtype).reshape(shape))
        offset += size
    return tuple(out)


def encode_signature(signature: Signature) -> str:
    return json.dumps([[list(shape), str(dtype).removeprefix("torch.")] for shape, dtype in signature])


def decode_signature(text: str | bytes) -> Signature:
    raw = json.loads(text)
    return [(tuple(shape), getattr(torch, dtype)) for shape, dtype in raw]


def to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, Tensor):
        if device.type == "cuda" and value.device.type == "cpu":
            # From pageable memory the copy would wait for every kernel already queued, so the
            # GPU would idle while this process launches the next ones; from pinned memory it is
            # queued like a kernel (the pinned block is kept until the copy has run).
            return value.pin_memory().to(device, non_blocking=True)
        return value.to(device)
    if isinstance(value, tuple | list):
        return type(value)(to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: to_device(v, device) for k, v in value.items()}
    return value


class AppStageRunner(IterationBook):
    """F / B / W of one stage module for the micro-batches of the current iteration."""

    def __init__(self, module: torch.nn.Module, app: TrainingApp, stage: int, stages: int,
                 loss_scale: float, swap_layers: bool = True):
        self.module, self.app = module, app
        self.first, self.last = stage == 0, stage == stages - 1
        self.loss_scale = loss_scale
        self.params = [p for p in module.parameters() if p.requires_grad]
        # B/W split: stock weight layers defer their weight gradients themselves
        # (deferred_modules); the generic graph split handles every other parameter. The first
        # stage's input takes no gradient, so its B is empty and its W is one ordinary backward:
        # swapped layers would only add their Python overhead there (benchmarks/bw_split_app.py).
        self.recorder = WeightRecorder()
        swap = swap_layers and not self.first
        self._swapped = swap_weight_layers(module, self.recorder) if swap else []
        self.graph_params = self._generic(self._swapped)
        self._coverage_checked = False
        self._forwarded: dict[Microbatch, tuple[list[Tensor], list[Tensor], MicrobatchWeights]] = {}
        self._awaiting_w: dict[Microbatch, tuple[PendingWeightGrad, MicrobatchWeights]] = {}
        self.losses: dict[Microbatch, Tensor] = {}
        """Each micro-batch's loss, kept on the device: reading it here would wait for the forward's
        kernels (on a GPU, every micro-batch); the all-reduce reads their sum once."""
        self.output_signature: Signature | None = None
        self._input_signature: Signature | None = None

    def forward(self, mb: Microbatch, x: Any, target: Any = None) -> tuple[Tensor, ...] | None:
        """F. `x`: the collated input on stage 0, else the received tuple. Returns the outputs to
        send (detached), or None on the last stage (its loss is kept in `losses`)."""
        if mb in self._forwarded or mb in self._awaiting_w:
            raise StageError(f"F of micro-batch {list(mb)} twice in one iteration")
        weights = MicrobatchWeights()
        self.recorder.current = weights
        try:
            if self.first:
                inputs: list[Tensor] = []
                out = self.module(x)
            else:
                inputs = [t.detach().requires_grad_(t.dtype.is_floating_point) for t in x]
                self._input_signature = signature_of(tuple(inputs))
                out = call_stage(self.module, tuple(inputs))
        finally:
            self.recorder.current = None
        if self.last:
            loss = self.app.loss(out, target)
            self.losses[mb] = loss.detach()
            roots = [loss * self.loss_scale]
        else:
            roots = list(as_tuple(out))
            if self.output_signature is None:
                self.output_signature = signature_of(tuple(roots))
        self._check_coverage(roots)
        self._forwarded[mb] = (inputs, roots, weights)
        return None if self.last else tuple(t.detach() for t in roots)

    def _generic(self, swapped: list[Tensor]) -> list[Tensor]:
        ids = {id(p) for p in swapped}
        return [p for p in self.params if id(p) not in ids]

    def _check_coverage(self, roots: list[Tensor]) -> None:
        """Once: a swapped layer's parameter that the graph also uses elsewhere goes back to the
        generic split, which then adds the other uses' gradient to the deferred one."""
        if self._coverage_checked:
            return
        self._coverage_checked = True
        shared = used_elsewhere([t for t in roots if t.requires_grad], self._swapped)
        if shared:
            ids = {id(p) for p in shared}
            self._swapped = [p for p in self._swapped if id(p) not in ids]
            self.graph_params = self._generic(self._swapped)

    def backward_input(self, mb: Microbatch, grads: tuple[Tensor, ...] | None) -> list[Tensor] | None:
        """B. `grads`: the received gradients of this stage's float outputs (None on the last
        stage). Returns the gradients of the float inputs to send upstream (None on stage 0)."""
        state = self._forwarded.pop(mb, None)
        if state is None:
            raise StageError(f"B of micro-batch {list(mb)} without a pending F")
        inputs, outputs, weights = state
        if self.last:
            pairs = [(outputs[0], torch.ones_like(outputs[0]))]
        else:
            if grads is None:
                raise StageError(f"B of micro-batch {list(mb)} needs the output gradients")
            floats = [t for t in outputs if t.dtype.is_floating_point]
            if len(floats) != len(grads):
                raise StageError(f"B of micro-batch {list(mb)}: {len(grads)} gradients for "
                                 f"{len(floats)} float outputs")
            pairs = [(t, g) for t, g in zip(floats, grads, strict=True) if t.requires_grad]
        outs = [t for t, _ in pairs]
        out_grads = [g for _, g in pairs]
        if outs:
            input_grads, pending = backward_input(outs, out_grads, inputs, self.graph_params)
            if not pending.outputs and weights.orphan_params():
                pending.outputs, pending.output_grads = outs, out_grads  # W must reach them
        else:  # nothing differentiable reached this stage's outputs: no gradient flows through it
            input_grads, pending = [None] * len(inputs), PendingWeightGrad()
        self._awaiting_w[mb] = (pending, weights)
        if self.first:
            return None
        return [g if g is not None else torch.zeros_like(t)
                for t, g in zip(inputs, input_grads, strict=True) if t.dtype.is_floating_point]

    def tensors_held_for_w(self, mb: Microbatch) -> list[Tensor]:
        """What micro-batch `mb` keeps alive between its B and its W besides saved activations:
        the gradients W starts from (memory profiling, `activation_w_mb`)."""
        pending, weights = self._awaiting_w[mb]
        captured = [g for group in pending.groups for grads in group.get("grads", ())
                    for g in grads or () if isinstance(g, Tensor)]
        return [*pending.output_grads, *captured, *weights.held_tensors()]

    def backward_weight(self, mb: Microbatch) -> None:
        state = self._awaiting_w.pop(mb, None)
        if state is None:
            raise StageError(f"W of micro-batch {list(mb)} without a finished B")
        pending, weights = state
        backward_weight(pending, self.graph_params, also_reach=weights.orphan_params())
        weights.flush()


class ReplicaState:
    """A stage replica's parameters and optimizer state: snapshots for rollback, and the bytes a
    live replica broadcasts to a rejoiner (any optimizer: its own `state_dict`)."""

    def __init__(self, module: torch.nn.Module, optimizer: torch.optim.Optimizer, host_memory: bool = False):
        self.module, self.optimizer = module, optimizer
        self.snapshots = SnapshotPool(host_memory)
        self._copying: list[Snapshot] = []
        """Snapshots whose copy may still be reading the state (a side stream on a GPU)."""

    def snapshot(self) -> Snapshot:
        snap = self.snapshots.take({"module": self.module.state_dict(),
                                    "optimizer": self.optimizer.state_dict()})
        if snap.ready is not None:
            self._copying.append(snap)
        return snap

    def before_step(self) -> None:
        """The optimizer step writes the state in place: it runs after every copy has read it."""
        for snap in self._copying:
            snap.before_change()
        self._copying.clear()

    def settle(self) -> None:
        """Before the state's tensors are replaced: the host waits for every copy still reading them."""
        for snap in self._copying:
            snap.wait()
        self._copying.clear()

    def restore(self, snap: Snapshot) -> None:
        self.settle()
        # The module copies the values into its parameters; the optimizer may keep the tensors it is
        # given, so it gets its own (the buffers will hold a later snapshot).
        self.module.load_state_dict(snap.rebuild(clone=False)["module"])
        self.optimizer.load_state_dict(snap.rebuild(clone=True)["optimizer"])

    def release(self, snap: Snapshot) -> None:
        self.snapshots.release(snap)

    def to_bytes(self) -> Tensor:
        buf = io.BytesIO()
        torch.save({"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict()}, buf)
        return torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)

    def load_bytes(self, data: Tensor) -> None:
        self.settle()
        state = torch.load(io.BytesIO(data.cpu().numpy().tobytes()), weights_only=True)
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
