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

from executor.model import ConfigError, ModelConfig


def microbatch_seed(seed: int, iteration: int, home: int, index: int) -> int:
    """A stable 63-bit seed for one micro-batch (the same on every machine and Python run)."""
    digest = hashlib.blake2b(f"{seed}/{iteration}/{home}/{index}".encode(), digest_size=8).digest()
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


class MicrobatchSource:
    """Loads (inputs, targets) of any micro-batch; both [batch_size, seq_len] int64."""

    def __init__(self, model: ModelConfig, data: DataConfig):
        self.model, self.data = model, data
        self._text: Tensor | None = None
        if data.text_file is not None:
            raw = Path(data.text_file).read_bytes()
            if len(raw) < model.seq_len + 1:
                raise ConfigError(
                    f"text_file: {data.text_file} has {len(raw)} bytes, fewer than seq_len + 1 = "
                    f"{model.seq_len + 1}",
                    "text_file",
                )
            self._text = torch.tensor(list(raw), dtype=torch.int64) % model.vocab

    def load(self, iteration: int, home: int, index: int) -> tuple[Tensor, Tensor]:
        gen = torch.Generator().manual_seed(microbatch_seed(self.model.seed, iteration, home, index))
        n, t, v = self.data.batch_size, self.model.seq_len, self.model.vocab
        if self._text is not None:
            starts = torch.randint(0, len(self._text) - t, (n,), generator=gen)
            tokens = torch.stack([self._text[a : a + t + 1] for a in starts.tolist()])
        else:
            start = torch.randint(0, v, (n, 1), generator=gen)
            stride = torch.randint(1, min(v, 5), (n, 1), generator=gen)
            tokens = (start + stride * torch.arange(t + 1)) % v
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()
