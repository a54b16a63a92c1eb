"""Plain single-process training of the same model on the same global batches: the ground truth
that every distributed run, with or without failures, must reproduce."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from executor.data import DataConfig, builtin_app
from executor.model import ModelConfig
from executor.optim import OptimConfig


@dataclass
class TrainingResult:
    losses: list[float]
    """Mean loss over the global batch (D x M micro-batches), one per iteration."""
    stage_parameters: list[dict[str, torch.Tensor]]
    """Each stage's parameters after the last iteration, by name."""

    def stage_parameter_norms(self) -> list[float]:
        return [float(torch.cat([t.reshape(-1) for t in ps.values()]).norm()) for ps in self.stage_parameters]


def train_reference(
    model: ModelConfig, stages: int, pipelines: int, microbatches: int, iterations: int,
    data: DataConfig | None = None, optim: OptimConfig | None = None,
) -> TrainingResult:
    """The built-in model, trained in one process (it is a training app like any other)."""
    return train_reference_app(builtin_app(model, data, optim), stages, pipelines, microbatches, iterations)


def train_reference_app(app, stages: int, pipelines: int, microbatches: int,
                        iterations: int) -> TrainingResult:
    """A training app (contracts.md) trained in one process: per iteration, the loss is the mean of
    the n = D x M micro-batch losses, every stage's gradient is the gradient of that mean, and each
    stage's optimizer steps once."""
    from executor.app import as_tuple, build_stage, call_stage

    modules = [build_stage(app, s, stages) for s in range(stages)]
    optimizers = [app.optimizer(m.parameters()) for m in modules]
    n = pipelines * microbatches
    losses = []
    for it in range(iterations):
        for m in modules:
            m.zero_grad(set_to_none=True)
        total = 0.0
        for j in range(n):
            x, target = app.microbatch(it, j, n)
            value = modules[0](x)
            for m in modules[1:]:
                value = call_stage(m, as_tuple(value))
            loss = app.loss(value, target)
            total += float(loss.detach())
            (loss / n).backward()
        for opt in optimizers:
            opt.step()
        losses.append(total / n)
    return TrainingResult(losses, [{k: v.detach().clone() for k, v in m.named_parameters()} for m in modules])
