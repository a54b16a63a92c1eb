"""A training app written only for the tests, in plain torch.nn: tuple activations between stages
(features, a skip tensor and integer labels carried along), SGD with momentum (not the built-in
AdamW), a stage-1 parameter that only the loss sees through the last stage, and a dataset whose
items are (input, target) pairs of plain tensors. SKIPNET_FORWARD_SLEEP_S slows stage 0's forward."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import torch
from torch import nn


class Points(torch.utils.data.Dataset):
    def __init__(self, count: int = 61):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(count, 6, generator=g)
        self.y = (self.x[:, :3].sum(1) > 0).long() + (self.x[:, 3] > 0.5).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class First(nn.Module):
    def __init__(self):
        super().__init__()
        self.inp = nn.Linear(6, 8)

    def forward(self, x):
        # Live tests that must outlast a process start-up slow the model down (no effect on the math).
        time.sleep(float(os.environ.get("SKIPNET_FORWARD_SLEEP_S", "0")))
        h = torch.tanh(self.inp(x))
        return h, x[:, :2].contiguous()


class Middle(nn.Module):
    def __init__(self):
        super().__init__()
        self.mix = nn.Linear(8, 8)
        self.gate = nn.Parameter(torch.full((8,), 0.5))

    def forward(self, h, skip):
        return torch.relu(self.mix(h)) * self.gate + h, skip


class Last(nn.Module):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(10, 3)

    def forward(self, h, skip):
        return self.head(torch.cat([h, skip], dim=1))


def build_stage(stage: int, stages: int) -> nn.Module:
    torch.manual_seed(100 + stage)
    if stage == 0:
        return First()
    if stage == stages - 1:
        return Last()
    return Middle()


def app():
    return SimpleNamespace(
        build_stage=build_stage,
        dataset=Points(),
        microbatch_size=3,
        loss=lambda out, target: nn.functional.cross_entropy(out, target),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.1, momentum=0.9),
    )
