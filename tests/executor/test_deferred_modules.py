"""The swapped weight layers' B/W split (executor/deferred_modules.py) against one ordinary backward.

Second method: the same module, a deep copy, run forward + `torch.autograd.backward` as any training
loop would; F, B, W through the worker's `AppStageRunner` must give the same input gradients and the
same parameter gradients, whatever mix of swapped layers, generic parameters, tied weights and layers
that B never reaches (orphans) the stage holds.
"""

from __future__ import annotations

import copy
import types

import pytest
import torch
from torch import nn

from executor.app_stage import AppStageRunner

APP = types.SimpleNamespace(loss=lambda out, target: ((out - target) ** 2).mean())


class ConvStage(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.conv2 = nn.Conv2d(8, 4, 3, padding=(1, 2), dilation=(1, 2), groups=2, bias=False)
        self.norm = nn.LayerNorm(4 * 4 * 4)
        self.head = nn.Linear(4 * 4 * 4, 5)

    def forward(self, x):
        h = torch.relu(self.conv1(x))
        return self.head(self.norm(torch.relu(self.conv2(h)).flatten(1)))


class TiedStage(nn.Module):
    """The Linear's weight is also used outside the Linear: the generic split must add that use."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.scale = nn.Parameter(torch.tensor(0.5))  # not a swapped layer's: always generic

    def forward(self, x):
        return torch.tanh(self.lin(x)) + self.scale * (x @ self.lin.weight)


class OrphanStage(nn.Module):
    """`lin` runs on a constant only: B (input gradient) never reaches it, W must, passing again
    through `out`, whose weight gradient B already deferred (it must count once)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("query", torch.randn(1, 16))
        self.lin = nn.Linear(16, 16)
        self.norm = nn.LayerNorm(16)
        self.out = nn.Linear(16, 16)

    def forward(self, x):
        return self.out(self.norm(x) * self.lin(self.query))


def _reference(module, x, target, last, out_grad):
    module = copy.deepcopy(module)
    x = x.detach().requires_grad_(x.dtype.is_floating_point)
    out = module(x)
    if last:
        APP.loss(out, target).backward()
    else:
        out.backward(out_grad)
    return x.grad, {n: p.grad for n, p in module.named_parameters()}


def _split(module, x, target, stage, stages, out_grad):
    runner = AppStageRunner(module, APP, stage, stages, 1.0)
    for i in range(2):  # twice: the second micro-batch must not see the first one's state
        module.zero_grad(set_to_none=True)
        out = runner.forward((0, i), x if stage == 0 else (x,), target)
        input_grads = runner.backward_input((0, i), None if out is None else (out_grad,))
        runner.backward_weight((0, i))
    grads = {n: p.grad for n, p in module.named_parameters()}
    return runner, (input_grads[0] if input_grads else None), grads


@pytest.mark.parametrize("build,shape,stage,stages", [
    (ConvStage, (2, 3, 8, 8), 1, 3),
    (ConvStage, (2, 3, 8, 8), 2, 3),
    (ConvStage, (2, 3, 8, 8), 0, 2),
    (TiedStage, (4, 16), 1, 3),
    (OrphanStage, (4, 16), 1, 3),
    (OrphanStage, (4, 16), 2, 3),
])
def test_split_gradients_equal_one_ordinary_backward(build, shape, stage, stages):
    torch.manual_seed(0)
    module = build()
    x = torch.randn(*shape)
    last = stage == stages - 1
    with torch.no_grad():
        out_shape = module(x).shape
    target, out_grad = torch.randn(out_shape), torch.randn(out_shape)
    want_input, want = _reference(module, x, target, last, out_grad)
    _, got_input, got = _split(module, x, target, stage, stages, out_grad)
    for name, grad in want.items():
        assert got[name] is not None, f"{name}: no gradient"
        torch.testing.assert_close(got[name], grad, rtol=1e-5, atol=1e-6, msg=name)
    if stage > 0:
        torch.testing.assert_close(got_input, want_input, rtol=1e-5, atol=1e-6)


def test_stock_layers_skip_the_graph_walk_and_shared_weights_do_not():
    torch.manual_seed(0)
    conv = ConvStage()
    runner, *_ = _split(conv, torch.randn(2, 3, 8, 8), torch.randn(2, 5), 1, 3, torch.randn(2, 5))
    assert runner.graph_params == []  # every parameter is a swapped layer's: no generic W at all
    tied = TiedStage()
    runner, *_ = _split(tied, torch.randn(4, 16), None, 1, 3, torch.randn(4, 16))
    generic = {id(p) for p in runner.graph_params}
    assert generic == {id(tied.lin.weight), id(tied.scale)}  # the bias is used by the Linear only
    first = ConvStage()
    runner, *_ = _split(first, torch.randn(2, 3, 8, 8), None, 0, 3, torch.randn(2, 5))
    assert len(runner.graph_params) == len(list(first.parameters()))  # nothing to split: no swap


def test_outside_a_recording_a_swapped_layer_is_the_ordinary_module():
    """Evaluation (no recording, or no grad) must not leave deferred work behind."""
    torch.manual_seed(0)
    module = ConvStage()
    runner = AppStageRunner(module, APP, 1, 3, 1.0)
    x = torch.randn(2, 3, 8, 8, requires_grad=True)
    module(x).sum().backward()
    assert all(p.grad is not None for p in module.parameters())
    assert runner.recorder.current is None
