"""A small GPT in plain torch.nn, trained byte by byte on a real text file: a training app
(contracts.md, "Training app") for `recycle train --app examples.gpt:app`.

The corpus, `examples/data/python_docs.txt`, is 200 KB of English prose and code examples: the
docstrings of 50 Python 3.11 standard-library modules (Python Software Foundation License),
written once by the snippet in `examples/README.md`. Tokens are bytes (vocabulary 256).

The model's blocks are split evenly over the stages: the embeddings sit on stage 0, the final
LayerNorm and the head on the last stage. `RECYCLE_GPT_LAYERS`, `RECYCLE_GPT_WIDTH` and
`RECYCLE_GPT_SEQ` size it (defaults 4, 64, 32: seconds per iteration on a laptop CPU).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import torch
from torch import nn
from torch.nn import functional as F

CORPUS = Path(__file__).resolve().parent / "data" / "python_docs.txt"
VOCAB = 256


def _setting(name: str, default: int) -> int:
    value = int(os.environ.get(name, default))
    if value < 1:
        raise ValueError(f"{name} must be >= 1, got {value}")
    return value


class ByteWindows(torch.utils.data.Dataset):
    """Item i: bytes [i*T, (i+1)*T] of the corpus as (input tokens, next-byte targets)."""

    def __init__(self, path: Path, seq_len: int):
        data = torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.uint8).long()
        self.data, self.seq_len = data, seq_len
        self.count = (len(data) - 1) // seq_len

    def __len__(self) -> int:
        return self.count

    def __getitem__(self, i: int):
        chunk = self.data[i * self.seq_len : (i + 1) * self.seq_len + 1]
        return chunk[:-1], chunk[1:]


class Block(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.qkv, self.proj = nn.Linear(width, 3 * width), nn.Linear(width, width)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln2(x))


class GPTStage(nn.Module):
    def __init__(self, stage: int, stages: int, layers: int, width: int, heads: int, seq_len: int):
        super().__init__()
        if layers < stages:
            raise ValueError(f"{layers} layers cannot be split over {stages} stages")
        first, last = stage == 0, stage == stages - 1
        lo, hi = stage * layers // stages, (stage + 1) * layers // stages
        self.tokens = nn.Embedding(VOCAB, width) if first else None
        self.positions = nn.Parameter(torch.zeros(seq_len, width)) if first else None
        self.blocks = nn.ModuleList(Block(width, heads) for _ in range(hi - lo))
        self.norm = nn.LayerNorm(width) if last else None
        self.head = nn.Linear(width, VOCAB, bias=False) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.tokens is not None:
            x = self.tokens(x) + self.positions[: x.shape[1]]
        for block in self.blocks:
            x = block(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def app():
    layers = _setting("RECYCLE_GPT_LAYERS", 4)
    width = _setting("RECYCLE_GPT_WIDTH", 64)
    seq_len = _setting("RECYCLE_GPT_SEQ", 32)
    heads = 4 if width % 4 == 0 else 1

    def build_stage(stage: int, stages: int) -> nn.Module:
        torch.manual_seed(1234 + stage)  # every process builds the same initial parameters
        module = GPTStage(stage, stages, layers, width, heads, seq_len)
        if module.positions is not None:
            nn.init.normal_(module.positions, std=0.02)
        return module

    def loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.reshape(-1, VOCAB), target.reshape(-1))

    return SimpleNamespace(
        build_stage=build_stage,
        dataset=ByteWindows(CORPUS, seq_len),
        microbatch_size=4,
        loss=loss,
        optimizer=lambda params: torch.optim.AdamW(params, lr=3e-3, weight_decay=0.01),
    )
