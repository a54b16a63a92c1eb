"""The per-stage optimizer: AdamW over one stage's parameters, stepped by that stage alone."""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from executor.model import ConfigError


@dataclass(frozen=True)
class OptimConfig:
    """AdamW hyper-parameters (the same on every stage)."""

    lr: float = 1e-3
    """Learning rate."""
    beta1: float = 0.9
    """First-moment decay."""
    beta2: float = 0.999
    """Second-moment decay."""
    eps: float = 1e-8
    """Denominator guard."""
    weight_decay: float = 0.01
    """Decoupled weight decay."""

    def __post_init__(self) -> None:
        checks = {
            "lr": self.lr > 0, "beta1": 0 <= self.beta1 < 1, "beta2": 0 <= self.beta2 < 1,
            "eps": self.eps > 0, "weight_decay": self.weight_decay >= 0,
        }
        for name, ok in checks.items():
            value = getattr(self, name)
            if not isinstance(value, int | float) or isinstance(value, bool) or value != value or not ok:
                raise ConfigError(f"{name}: out of range, got {value!r}", name)

    def to_json(self) -> dict[str, float]:
        return asdict(self)


def make_optimizer(params, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW over `params` (a module's parameters, or the module itself)."""
    if isinstance(params, torch.nn.Module):
        params = params.parameters()
    # foreach=False: one code path on every device, so replicas and the reference round identically.
    return torch.optim.AdamW(
        params, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), eps=cfg.eps,
        weight_decay=cfg.weight_decay, foreach=False,
    )
