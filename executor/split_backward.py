"""Autograd functions whose weight gradients are deferred: the B/W split of Zero Bubble.

Each function's backward returns only the gradient w.r.t. its activation input and records, in a
`WeightGradStore`, a closure with exactly the tensors the weight gradient needs (the layer input it
saved in forward and the output gradient it just received). B is then a plain autograd pass from
the stage output to the stage input; W replays the recorded closures. Nothing is computed twice:
B skips every weight-gradient GEMM and W only runs those GEMMs, so T_B + T_W is one full backward.

Called with `store=None`, each helper is the ordinary torch op (weight gradients in the same
backward pass), which is what the single-process reference and the full-backward baseline use.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor


class WeightGradStore:
    """The weight-gradient work one micro-batch's B left for its W."""

    def __init__(self) -> None:
        self._pending: list[Callable[[], None]] = []

    def defer(self, work: Callable[[], None]) -> None:
        self._pending.append(work)

    def __len__(self) -> int:
        return len(self._pending)

    def flush(self) -> None:
        """Run W: accumulate every deferred weight gradient into `param.grad`, then drop the tensors."""
        pending, self._pending = self._pending, []
        # The saved layer inputs still require grad; W must not record a graph of its own.
        with torch.no_grad():
            for work in pending:
                work()


def _accumulate(param: Tensor, grad: Tensor) -> None:
    """`grad` is always a fresh tensor computed by W, so the first one can be adopted without a copy."""
    if param.grad is None:
        param.grad = grad
    else:
        param.grad.add_(grad)




class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, bias: Tensor | None, store: WeightGradStore | None):
        ctx.save_for_backward(x, weight)
        ctx.bias, ctx.store = bias, store
        return torch.nn.functional.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, weight = ctx.saved_tensors
        grad_x = grad_out @ weight if ctx.needs_input_grad[0] else None
        bias, store = ctx.bias, ctx.store

        def weight_work():
            g2 = grad_out.reshape(-1, grad_out.shape[-1])
            _accumulate(weight, g2.t() @ x.reshape(-1, x.shape[-1]))
            if bias is not None:
                _accumulate(bias, g2.sum(0))

        store.defer(weight_work)
        return grad_x, None, None, None


class _LayerNorm(torch.autograd.Function):
    """LayerNorm over the last dimension with the fused aten kernels: B asks the backward kernel for
    the input gradient only, W for the gamma/beta gradients only (same kernel, other output mask)."""

    EPS = 1e-5

    @staticmethod
    def forward(ctx, x: Tensor, gamma: Tensor, beta: Tensor, store: WeightGradStore | None):
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, gamma.shape, gamma, beta, _LayerNorm.EPS)
        ctx.save_for_backward(x, gamma, beta, mean, rstd)
        ctx.store = store
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        x, gamma, beta, mean, rstd = ctx.saved_tensors
        grad_out = grad_out.contiguous()
        shape = list(gamma.shape)
        grad_x = None
        if ctx.needs_input_grad[0]:
            grad_x = torch.ops.aten.native_layer_norm_backward(
                grad_out, x, shape, mean, rstd, gamma, beta, [True, False, False]
            )[0]

        def weight_work():
            _, gg, gb = torch.ops.aten.native_layer_norm_backward(
                grad_out, x, shape, mean, rstd, gamma, beta, [False, True, True]
            )
            _accumulate(gamma, gg)
            _accumulate(beta, gb)

        ctx.store.defer(weight_work)
        return grad_x, None, None, None


class _Embedding(torch.autograd.Function):
    """Token embedding plus learned positions; tokens have no gradient, so all of it is W."""

    @staticmethod
    def forward(ctx, tokens: Tensor, table: Tensor, positions: Tensor, store: WeightGradStore | None):
        ctx.save_for_backward(tokens, table, positions)
        ctx.store = store
        return table[tokens] + positions[: tokens.shape[-1]]

    @staticmethod
    def backward(ctx, grad_out: Tensor):
        tokens, table, positions = ctx.saved_tensors
        store = ctx.store

        def weight_work():
            g_table = torch.zeros_like(table).index_add_(
                0, tokens.reshape(-1), grad_out.reshape(-1, grad_out.shape[-1])
            )
            g_pos = torch.zeros_like(positions)
            g_pos[: tokens.shape[-1]] = grad_out.sum(0)
            _accumulate(table, g_table)
            _accumulate(positions, g_pos)

        store.defer(weight_work)
        return None, None, None, None


def linear(x: Tensor, weight: Tensor, bias: Tensor | None, store: WeightGradStore | None) -> Tensor:
    if store is None:
        return torch.nn.functional.linear(x, weight, bias)
    return _Linear.apply(x, weight, bias, store)


def layer_norm(x: Tensor, gamma: Tensor, beta: Tensor, store: WeightGradStore | None) -> Tensor:
    if store is None:
        return torch.nn.functional.layer_norm(x, gamma.shape, gamma, beta, _LayerNorm.EPS)
    return _LayerNorm.apply(x, gamma, beta, store)


def embedding(tokens: Tensor, table: Tensor, positions: Tensor, store: WeightGradStore | None) -> Tensor:
    if store is None:
        return torch.nn.functional.embedding(tokens, table) + positions[: tokens.shape[-1]]
    return _Embedding.apply(tokens, table, positions, store)
