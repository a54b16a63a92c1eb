"""Deterministic data: micro-batch (iteration, home pipeline, index) always yields the same tokens.

Any worker can load any micro-batch without asking anyone, which is what lets a peer take over a
failed worker's micro-batches (and lets the first and last stage load inputs and targets
independently). Two sources: a synthetic stream of modular arithmetic sequences (learnable: the
next token follows from the stride seen so far) or a local text file read as bytes.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import Tensor

from executor.model import ConfigError, ModelConfig, StageModule, loss
from executor.optim import OptimConfig, make_optimizer

SAMPLES = 2**31 - 1
"""Dataset length: items are generated, so the contract's item indices never wrap in practice."""


def sample_seed(seed: int, item: int) -> int:
    """A stable 63-bit seed for one sample (the same on every machine and Python run)."""
    digest = hashlib.blake2b(f"{seed}/{item}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


@dataclass(frozen=True)
class DataConfig:
    """Where samples come from and how many form a micro-batch."""

    batch_size: int = 2
    """Samples per micro-batch."""
    text_file: str | None = None
    """A local text file to read windows from (bytes modulo vocab); None: synthetic sequences."""

    def __post_init__(self) -> None:
        if not isinstance(self.batch_size, int) or isinstance(self.batch_size, bool) or self.batch_size < 1:
            raise ConfigError(f"batch_size: must be an integer >= 1, got {self.batch_size!r}", "batch_size")
        if self.text_file is not None and not Path(self.text_file).is_file():
            raise ConfigError(f"text_file: {self.text_file} is not a readable file", "text_file")


class Samples(torch.utils.data.Dataset):
    """Item i: (tokens[seq_len], next tokens[seq_len]), int64."""

    def __init__(self, model: ModelConfig, data: DataConfig):
        self.model, self.data = model, data
        self._text: Tensor | None = None
        if data.text_file is not None:
            raw = Path(data.text_file).read_bytes()
            if len(raw) < model.seq_len + 1:
                raise ConfigError(f"text_file: {data.text_file} has {len(raw)} bytes, fewer than seq_len + "
                                  f"1 = {model.seq_len + 1}", "text_file")
            self._text = torch.tensor(list(raw), dtype=torch.int64) % model.vocab

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, item: int) -> tuple[Tensor, Tensor]:
        gen = torch.Generator().manual_seed(sample_seed(self.model.seed, item))
        t, v = self.model.seq_len, self.model.vocab
        if self._text is not None:
            start = int(torch.randint(0, len(self._text) - t, (1,), generator=gen))
            tokens = self._text[start : start + t + 1]
        else:
            start = torch.randint(0, v, (1,), generator=gen)
            stride = torch.randint(1, min(v, 5), (1,), generator=gen)
            tokens = (start + stride * torch.arange(t + 1)) % v
        return tokens[:-1].clone(), tokens[1:].clone()


def builtin_app(model: dict | ModelConfig, data: dict | DataConfig | None = None,
                optim: dict | OptimConfig | None = None):
    """The toy transformer as a `TrainingApp` (what workers run when no `--app` is given)."""
    from executor.app import TrainingApp

    model = model if isinstance(model, ModelConfig) else ModelConfig(**model)
    data = data if isinstance(data, DataConfig) else DataConfig(**(data or {}))
    optim = optim if isinstance(optim, OptimConfig) else OptimConfig(**(optim or {}))

    def optimizer(params) -> torch.optim.Optimizer:
        return make_optimizer(params, optim)

    return TrainingApp(spec="(built-in model)", build_stage=lambda s, n: StageModule(model, n, s),
                       dataset=Samples(model, data), microbatch_size=data.batch_size, loss=loss,
                       optimizer=optimizer)
