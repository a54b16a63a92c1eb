"""A small convolutional classifier on generated images, as a training app
(`recycle train --app examples.conv:app`): stages pass a tuple (feature map, pooled skip
features) to the next, so receive buffers of several shapes are exercised.

Data: 16x16 single-channel images of one of four patterns (horizontal stripes, vertical stripes,
a centred square, a diagonal), each with a random shift and noise, from a fixed seed.
"""

from __future__ import annotations

from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F

CLASSES = 4
SIZE = 16


class Patterns(torch.utils.data.Dataset):
    def __init__(self, count: int = 512, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        ys = torch.randint(0, CLASSES, (count,), generator=g)
        grid = torch.arange(SIZE)
        images = []
        for y in ys.tolist():
            shift = int(torch.randint(0, 4, (1,), generator=g))
            if y == 0:
                img = ((grid[:, None] + shift) % 4 < 2).float().expand(SIZE, SIZE)
            elif y == 1:
                img = ((grid[None, :] + shift) % 4 < 2).float().expand(SIZE, SIZE)
            elif y == 2:
                lo, hi = 4 + shift // 2, 12 - shift // 2
                img = ((grid[:, None] >= lo) & (grid[:, None] < hi) & (grid[None, :] >= lo)
                       & (grid[None, :] < hi)).float()
            else:
                img = ((grid[:, None] - grid[None, :] + shift).abs() < 2).float()
            images.append(img + 0.3 * torch.randn(SIZE, SIZE, generator=g))
        self.x = torch.stack(images).unsqueeze(1)
        self.y = ys

    def __len__(self) -> int:
        return len(self.y)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


class Stem(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(1, channels, 3, padding=1)

    def forward(self, x):
        h = F.relu(self.conv(x))
        return h, h.mean(dim=(2, 3))


class ConvBlock(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.norm = nn.BatchNorm2d(channels, track_running_stats=False)

    def forward(self, h, skip):
        h = h + F.relu(self.norm(self.conv(h)))
        return h, skip + h.mean(dim=(2, 3))


class Head(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.block = ConvBlock(channels)
        self.out = nn.Linear(2 * channels, CLASSES)

    def forward(self, h, skip):
        h, skip = self.block(h, skip)
        return self.out(torch.cat([F.adaptive_max_pool2d(h, 1).flatten(1), skip], dim=1))


class Whole(nn.Module):
    """One stage holding everything (stages = 1)."""

    def __init__(self, channels: int):
        super().__init__()
        self.stem, self.head = Stem(channels), Head(channels)

    def forward(self, x):
        return self.head(*self.stem(x))


def app():
    channels = 8

    def build_stage(stage: int, stages: int) -> nn.Module:
        torch.manual_seed(99 + stage)
        if stages == 1:
            return Whole(channels)
        if stage == 0:
            return Stem(channels)
        if stage == stages - 1:
            return Head(channels)
        return ConvBlock(channels)

    return SimpleNamespace(
        build_stage=build_stage,
        dataset=Patterns(),
        microbatch_size=8,
        loss=lambda logits, target: F.cross_entropy(logits, target),
        optimizer=lambda params: torch.optim.SGD(params, lr=0.05, momentum=0.9),
    )
