"""Fast B/W split for the standard weight layers of any model: `nn.Linear`, `nn.LayerNorm`, `nn.ConvNd`.

The generic split (`autograd_split`) walks the autograd graph of every micro-batch in Python and
runs one `autograd.grad` per parameter group for W. On a CPU that overhead was 10-25% of a full
backward on the GPT example (and 2x at its default size, where ops are small). Most parameters of
real models live in a few layer types whose backward is two independent kernels, one for the input
and one for the weights. So each such submodule's `forward` is swapped, at stage build, for an
autograd function whose backward computes the input gradient only and defers, per micro-batch, a
closure that computes the weight gradients from exactly the tensors they need (the layer input and
the output gradient): B is one plain `autograd.grad` to the stage inputs, W runs the closures.
Nothing is computed twice and no graph is walked. The kernels are the ones autograd itself uses
(`F.linear`'s GEMMs, `native_layer_norm_backward` and `convolution_backward` with an output mask),
so gradients match an ordinary backward.

Everything else stays with the generic split: parameters of other modules, and a parameter of a
swapped module that is also used outside it (a tied weight, a regulariser) - the first micro-batch
of each runner checks that in its graph (`verify_coverage`). A swapped layer that B never reached
(its input did not depend on the stage input, e.g. everything on stage 0) is an "orphan": W runs
the backward to its weights then. The swap is skipped, per call, under autocast, without grad
mode, and outside a recording (`recorder.current is None`), where the module is its ordinary self.
"""

from __future__ import annotations

import types
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.nn import functional as F


def _accumulate(param: Tensor, grad: Tensor | None) -> None:
    if grad is None:
        return
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)


class _Entry:
    """One swapped layer call of one micro-batch: its parameters and, once B reached it, its W."""

    __slots__ = ("params", "work")

    def __init__(self, params: tuple[Tensor, ...]):
        self.params, self.work = params, None

    def defer(self, work: Callable[[], None]) -> None:
        if self.work is None:  # a later pass through the same node (an orphan pass) adds nothing
            self.work = work


class MicrobatchWeights:
    """The deferred weight-gradient work of one micro-batch's swapped layers."""

    def __init__(self) -> None:
        self.entries: list[_Entry] = []

    def orphan_params(self) -> list[Tensor]:
        """Parameters of calls whose backward has not run yet (B did not reach them)."""
        seen: dict[int, Tensor] = {}
        for entry in self.entries:
            if entry.work is None:
                seen.update((id(p), p) for p in entry.params)
        return list(seen.values())

    def held_tensors(self) -> list[Tensor]:
        """The activations and gradients the deferred work keeps alive (for memory profiling)."""
        held: list[Tensor] = []
        functions = [entry.work for entry in self.entries if entry.work is not None]
        while functions:
            for cell in functions.pop().__closure__ or ():
                value = cell.cell_contents
                if callable(value) and getattr(value, "__closure__", None):
                    functions.append(value)
                elif isinstance(value, Tensor) and not isinstance(value, nn.Parameter):
                    held.append(value)
        return held

    def flush(self) -> None:
        """W for the swapped layers: accumulate every deferred gradient, then drop the tensors."""
        entries, self.entries = self.entries, []
        with torch.no_grad():
            for entry in entries:
                if entry.work is not None:
                    entry.work()


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, entry: _Entry):
        ctx.save_for_backward(x, weight)
        ctx.has_bias, ctx.entry = bias is not None, entry
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight = ctx.saved_tensors
        grad_x = grad_out @ weight if ctx.needs_input_grad[0] else None
        params, has_bias = ctx.entry.params, ctx.has_bias

        def work() -> None:
            g2 = grad_out.reshape(-1, grad_out.shape[-1])
            _accumulate(params[0], g2.t() @ x.reshape(-1, x.shape[-1]))
            if has_bias:
                _accumulate(params[1], g2.sum(0))

        ctx.entry.defer(work)
        return grad_x, None, None, None


class _LayerNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, shape: list[int], weight: Tensor | None, bias: Tensor | None, eps: float,
                entry: _Entry):
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, shape, weight, bias, eps)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.shape, ctx.entry = shape, entry
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight, bias, mean, rstd = ctx.saved_tensors
        # One kernel for all three: the weight and bias gradients are two reductions over the
        # normalized input the kernel computes anyway, so splitting them off would redo that pass in
        # W (measured slower); only their accumulation waits for W, holding two vectors of the
        # normalized shape instead of the layer's input and output gradient.
        grad_x, g_weight, g_bias = torch.ops.aten.native_layer_norm_backward(
            grad_out.contiguous(), x, ctx.shape, mean, rstd, weight, bias,
            [ctx.needs_input_grad[0], weight is not None, bias is not None])

        def work() -> None:
            if weight is not None:
                _accumulate(weight, g_weight)
            if bias is not None:
                _accumulate(bias, g_bias)

        ctx.entry.defer(work)
        return grad_x, None, None, None, None, None


class _Conv(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, geometry: tuple, entry: _Entry):
        stride, padding, dilation, groups = geometry
        ctx.save_for_backward(x, weight)
        ctx.geometry, ctx.has_bias, ctx.entry = geometry, bias is not None, entry
        zeros = [0] * len(stride)
        return torch.ops.aten.convolution(x, weight, bias, stride, padding, dilation, False, zeros, groups)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight = ctx.saved_tensors
        stride, padding, dilation, groups = ctx.geometry
        zeros, has_bias, params = [0] * len(stride), ctx.has_bias, ctx.entry.params
        bias_sizes = [weight.shape[0]] if has_bias else None

        def kernel(mask: list[bool]) -> tuple:
            return torch.ops.aten.convolution_backward(grad_out, x, weight, bias_sizes, stride, padding,
                                                       dilation, False, zeros, groups, mask)

        grad_x = kernel([True, False, False])[0] if ctx.needs_input_grad[0] else None

        def work() -> None:
            _, g_weight, g_bias = kernel([False, True, has_bias])
            _accumulate(params[0], g_weight)
            if has_bias:
                _accumulate(params[1], g_bias)

        ctx.entry.defer(work)
        return grad_x, None, None, None, None


class WeightRecorder:
    """Where swapped layers put their deferred work: `current` is the micro-batch being forwarded."""

    def __init__(self) -> None:
        self.current: MicrobatchWeights | None = None

    def entry(self, x: Tensor, params: tuple[Tensor | None, ...]) -> _Entry | None:
        """A new entry when this call should be swapped, else None (run the ordinary module)."""
        if self.current is None or not torch.is_grad_enabled() or type(x) not in (Tensor, nn.Parameter):
            return None
        present = tuple(p for p in params if p is not None)
        if not present or not all(p.requires_grad and p.is_leaf and type(p) in (Tensor, nn.Parameter)
                                  for p in present):
            return None
        if torch.is_autocast_enabled(x.device.type):
            return None
        entry = _Entry(present)
        self.current.entries.append(entry)
        return entry


def _linear_forward(recorder: WeightRecorder) -> Callable:
    def forward(self: nn.Linear, x: Tensor) -> Tensor:
        entry = recorder.entry(x, (self.weight, self.bias))
        if entry is None:
            return F.linear(x, self.weight, self.bias)
        return _Linear.apply(x, self.weight, self.bias, entry)
    return forward


def _layer_norm_forward(recorder: WeightRecorder) -> Callable:
    def forward(self: nn.LayerNorm, x: Tensor) -> Tensor:
        entry = recorder.entry(x, (self.weight, self.bias))
        if entry is None:
            return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, self.eps)
        return _LayerNorm.apply(x, list(self.normalized_shape), self.weight, self.bias, self.eps, entry)
    return forward


def _conv_forward(recorder: WeightRecorder, ordinary: Callable) -> Callable:
    def forward(self: nn.modules.conv._ConvNd, x: Tensor) -> Tensor:
        entry = recorder.entry(x, (self.weight, self.bias))
        if entry is None:
            return ordinary(x)
        geometry = (list(self.stride), list(self.padding), list(self.dilation), self.groups)
        return _Conv.apply(x, self.weight, self.bias, geometry, entry)
    return forward


_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)


def _swappable(module: nn.Module) -> str | None:
    """Which swap fits `module`: only the stock classes (or subclasses that keep their forward)."""
    if isinstance(module, nn.Linear) and type(module).forward is nn.Linear.forward:
        return "linear"
    if isinstance(module, nn.LayerNorm) and type(module).forward is nn.LayerNorm.forward:
        return "layer_norm"
    if (isinstance(module, _CONVS) and type(module).forward in {c.forward for c in _CONVS}
            and module.padding_mode == "zeros" and not isinstance(module.padding, str)):
        return "conv"
    return None


def swap_weight_layers(module: nn.Module, recorder: WeightRecorder) -> list[Tensor]:
    """Swap the forwards of `module`'s stock weight layers; return the parameters they own alone
    (a parameter also owned by another submodule, e.g. tied to an embedding, stays generic)."""
    owners: dict[int, int] = {}
    for _, param in module.named_parameters(remove_duplicate=False):
        owners[id(param)] = owners.get(id(param), 0) + 1
    covered: dict[int, Tensor] = {}
    for sub in module.modules():
        kind = _swappable(sub)
        if kind is None or "forward" in sub.__dict__:
            continue
        if kind == "linear":
            sub.forward = types.MethodType(_linear_forward(recorder), sub)
        elif kind == "layer_norm":
            sub.forward = types.MethodType(_layer_norm_forward(recorder), sub)
        else:
            sub.forward = types.MethodType(_conv_forward(recorder, type(sub).forward.__get__(sub)), sub)
        for param in sub.parameters(recurse=False):
            if param.requires_grad and owners[id(param)] == 1:
                covered[id(param)] = param
    return list(covered.values())


_SWAPPED = (_Linear, _LayerNorm, _Conv)


def used_elsewhere(outputs: list[Tensor], covered: list[Tensor]) -> list[Tensor]:
    """The covered parameters that this graph also uses outside a swapped layer: one walk from the
    outputs, looking at who feeds each covered parameter's gradient accumulator."""
    from torch.autograd.graph import Node

    accumulators = {}
    for param in covered:
        node = param.view_as(param).grad_fn.next_functions[0][0]  # the AccumulateGrad node
        accumulators[node] = param
    found: dict[int, Tensor] = {}
    stack: list[Node] = [t.grad_fn for t in outputs if t.grad_fn is not None]
    seen = set(stack)
    while stack:
        node = stack.pop()
        swapped = getattr(node, "_forward_cls", None) in _SWAPPED
        for child, _ in node.next_functions:
            if child is None:
                continue
            if child in accumulators and not swapped:
                found[id(accumulators[child])] = accumulators[child]
            if child not in seen:
                seen.add(child)
                stack.append(child)
    return list(found.values())
