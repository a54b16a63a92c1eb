"""Split any module's backward into B (input gradient) and W (weight gradient) through autograd.

The technique of `torch.distributed.pipelining._backward` (`stage_backward_input` /
`stage_backward_weight`, torch 2.13.0, whose graph helpers we reuse): walk the reverse autograd
graph from the stage outputs; every parameter's subgraph meets the closure of the stage inputs at
some intermediate nodes; B runs `autograd.grad(outputs, inputs, retain_graph=True)` with pre-hooks
on those nodes that capture the gradients flowing into the weight subgraphs; W later runs
`autograd.grad` from the captured intermediates to the parameters, so it never redoes B.

Two cases torch's helpers leave to the caller, handled here so that no gradient is ever lost:
- a stage with no differentiable input (stage 0, or integer inputs): B has nothing to compute and
  W runs the full backward from the outputs;
- parameters whose subgraph never meets the input closure (e.g. a loss term of the weights only):
  B keeps the output side of the graph and W takes those parameters' gradients from the outputs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch.autograd.graph import GradientEdge
from torch.distributed.pipelining._backward import (
    _get_grad_fn_or_grad_acc,
    construct_reverse_graph,
    get_param_groups,
)


@dataclass
class PendingWeightGrad:
    """What W needs of one micro-batch after its B."""

    groups: list[dict[str, Any]] = field(default_factory=list)
    """Parameter groups with their intermediates and the gradients captured there."""
    outputs: list[torch.Tensor] = field(default_factory=list)
    output_grads: list[torch.Tensor] = field(default_factory=list)
    direct: list[torch.nn.Parameter] = field(default_factory=list)
    """Parameters W differentiates from the outputs (not reachable through the groups)."""


def _accumulate(param: torch.Tensor, grad: torch.Tensor | None) -> None:
    if grad is None:
        return
    if param.grad is None:
        param.grad = grad.detach().clone() if grad.requires_grad else grad
    else:
        param.grad += grad


def backward_input(outputs: list[torch.Tensor], output_grads: list[torch.Tensor],
                   inputs: list[torch.Tensor], params: list[torch.nn.Parameter],
                   ) -> tuple[list[torch.Tensor | None], PendingWeightGrad]:
    """B: gradients of `inputs` (None where an input got none); the rest waits in the returned
    `PendingWeightGrad` for `backward_weight`. `outputs` and `output_grads` pair up one to one."""
    params = [p for p in params if p.requires_grad]
    diff_inputs = [t for t in inputs if t.requires_grad]
    if not diff_inputs:
        return [None] * len(inputs), PendingWeightGrad(outputs=outputs, output_grads=output_grads,
                                                       direct=params)
    if not params:  # nothing for W here: no graph to walk (retained: the caller may still need it)
        grads = torch.autograd.grad(outputs, diff_inputs, output_grads, retain_graph=True,
                                    allow_unused=True)
        by_input = {id(t): g for t, g in zip(diff_inputs, grads, strict=True)}
        return [by_input.get(id(t)) for t in inputs], PendingWeightGrad()
    output_nodes = [n for n in map(_get_grad_fn_or_grad_acc, outputs) if n is not None]
    input_nodes = [n for n in map(_get_grad_fn_or_grad_acc, diff_inputs) if n is not None]
    node_of = {id(p): _get_grad_fn_or_grad_acc(p) for p in params}
    reverse = construct_reverse_graph(output_nodes)
    groups = get_param_groups(input_nodes, [n for n in node_of.values() if n is not None], reverse)
    covered = {n for g in groups for n in g["params"]}
    # A parameter absent from the reverse graph does not influence the outputs at all.
    direct = [p for p in params if node_of[id(p)] not in covered and node_of[id(p)] in reverse]
    handles = []
    for group in groups:
        group["intermediates"] = list(group["intermediates"])
        group["grads"] = [None] * len(group["intermediates"])
        for i, node in enumerate(group["intermediates"]):
            def capture(grad_inputs, group=group, i=i):
                group["grads"][i] = grad_inputs
            handles.append(node.register_prehook(capture))
    try:
        grads = torch.autograd.grad(outputs, diff_inputs, output_grads, retain_graph=True,
                                    allow_unused=True)
    finally:
        for h in handles:
            h.remove()
    by_input = {id(t): g for t, g in zip(diff_inputs, grads, strict=True)}
    pending = PendingWeightGrad(groups=groups, direct=direct)
    if direct:
        pending.outputs, pending.output_grads = outputs, output_grads
    # Otherwise the output side of the graph is freed with the caller's last reference to the
    # outputs (no in-place `detach_` as torch does: an output that a layer also saved, e.g. a skip
    # connection fed to the next Linear, would break W).
    return [by_input.get(id(t)) for t in inputs], pending


def backward_weight(pending: PendingWeightGrad, params: list[torch.nn.Parameter],
                    also_reach: list[torch.Tensor] = ()) -> None:
    """W: accumulate the parameters' gradients into `.grad` and free the graph. `also_reach`:
    tensors whose backward nodes must run in this pass from the outputs although their gradient is
    not wanted here (the weights of swapped layers that B did not reach, `deferred_modules`)."""
    by_node = {_get_grad_fn_or_grad_acc(p): p for p in params if p.requires_grad}
    reach = [t for t in also_reach if all(t is not p for p in pending.direct)]
    from_outputs = bool(pending.outputs) and bool(pending.direct or reach)
    for n, group in enumerate(pending.groups):
        edges, grads = [], []
        for captured, node in zip(group["grads"], group["intermediates"], strict=True):
            for i, g in enumerate(captured or ()):
                if g is not None:
                    edges.append(GradientEdge(node, i))
                    grads.append(g)
        if not edges:
            continue
        handles = []
        if len(group["intermediates"]) > 1:
            # An intermediate below another one would otherwise count that gradient twice.
            for captured, node in zip(group["grads"], group["intermediates"], strict=True):
                handles.append(node.register_prehook(lambda _grads, c=captured: c))
        nodes = list(group["params"])
        group_params = [by_node[node] for node in nodes]
        keep = n < len(pending.groups) - 1 or from_outputs
        try:
            dweights = torch.autograd.grad(edges, [GradientEdge(node, 0) for node in nodes],
                                           grad_outputs=grads, retain_graph=keep, allow_unused=True)
        finally:
            for h in handles:
                h.remove()
        for p, g in zip(group_params, dweights, strict=True):
            _accumulate(p, g)
    if from_outputs:
        dweights = torch.autograd.grad(pending.outputs, pending.direct + reach, pending.output_grads,
                                       allow_unused=True)
        for p, g in zip(pending.direct, dweights, strict=False):
            _accumulate(p, g)
    pending.groups.clear()
    pending.outputs, pending.output_grads = [], []
