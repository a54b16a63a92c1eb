"""A small decoder-only transformer, split by layers into pipeline stages.

Stage 0 holds the token and position embeddings, the last stage the final LayerNorm, the LM head
and the loss; every stage holds a contiguous run of transformer blocks. A stage's parameters are
drawn from a generator seeded by (model seed, stage), so every replica of a stage starts with the
same parameters in any process, and the single-process reference builds exactly the same stages.

Written in plain torch.nn: it runs as a training app like any user's model (`builtin_app`), with
the executor's B/W split for any module (`executor/deferred_modules.py`, `autograd_split.py`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
from torch import Tensor, nn


class ConfigError(ValueError):
    """A model or training option that cannot work; the message names the field."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


@dataclass(frozen=True)
class ModelConfig:
    """Shape of the transformer and the seed of its initial parameters and data."""

    layers: int = 4
    """Transformer blocks in the whole model; split as evenly as possible over the stages."""
    width: int = 32
    """Hidden size of every block (embedding dimension)."""
    heads: int = 2
    """Attention heads per block; must divide `width`."""
    vocab: int = 64
    """Vocabulary size (token ids are 0..vocab-1)."""
    seq_len: int = 16
    """Tokens per sample; the model predicts each next token from the ones before it."""
    seed: int = 0
    """Seeds the initial parameters (per stage) and the synthetic data (per micro-batch)."""

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, int) or isinstance(value, bool):
                raise ConfigError(f"{f.name}: must be an integer, got {value!r}", f.name)
            low = 0 if f.name == "seed" else 1
            if value < low:
                raise ConfigError(f"{f.name}: must be >= {low}, got {value}", f.name)
        if self.vocab < 2:
            raise ConfigError(f"vocab: must be >= 2, got {self.vocab}", "vocab")
        if self.width % self.heads:
            raise ConfigError(f"heads: {self.heads} does not divide width {self.width}", "heads")

    def to_json(self) -> dict[str, int]:
        return asdict(self)

    def stage_layers(self, stages: int) -> list[range]:
        """The block indices of each stage: contiguous, sizes differing by at most one."""
        if not isinstance(stages, int) or stages < 1:
            raise ConfigError(f"stages: must be an integer >= 1, got {stages!r}", "stages")
        if stages > self.layers:
            raise ConfigError(
                f"layers: {self.layers} blocks cannot fill {stages} stages (need layers >= stages)",
                "layers",
            )
        base, extra = divmod(self.layers, stages)
        out, start = [], 0
        for s in range(stages):
            size = base + (1 if s < extra else 0)
            out.append(range(start, start + size))
            start += size
        return out


def _stage_seed(seed: int, stage: int) -> int:
    # Distinct, stable streams per stage; large odd multiplier keeps (seed, stage) pairs apart.
    return (seed * 1_000_003 + stage * 7919 + 17) % (2**63 - 1)


def _linear(n_in: int, n_out: int, gen: torch.Generator, bias: bool = True) -> nn.Linear:
    layer = nn.Linear(n_in, n_out, bias=bias)
    with torch.no_grad():
        # GPT-2's initial scale: keeps the residual stream O(1) through a few blocks.
        layer.weight.copy_(torch.randn((n_out, n_in), generator=gen) * 0.02)
        if bias:
            layer.bias.zero_()
    return layer


class Block(nn.Module):
    """Pre-LayerNorm block: causal self-attention then a 4x GELU MLP, each with a residual."""

    def __init__(self, width: int, heads: int, gen: torch.Generator):
        super().__init__()
        self.heads = heads
        self.ln1, self.ln2 = nn.LayerNorm(width), nn.LayerNorm(width)
        # No q/k/v bias: the key bias has an exactly zero gradient (softmax ignores a shift shared by
        # all keys), and AdamW would turn its rounding noise into lr-sized random steps.
        self.qkv = _linear(width, 3 * width, gen, bias=False)
        self.proj = _linear(width, width, gen)
        self.fc = _linear(width, 4 * width, gen)
        self.out = _linear(4 * width, width, gen)

    def forward(self, x: Tensor) -> Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(att.transpose(1, 2).reshape(b, t, c))
        return x + self.out(torch.nn.functional.gelu(self.fc(self.ln2(x))))


class StageModule(nn.Module):
    """One pipeline stage. Input: token ids (stage 0) or hidden states; output: hidden states, or
    on the last stage the next-token logits (`loss` turns them into the micro-batch's loss)."""

    def __init__(self, config: ModelConfig, stages: int, stage: int):
        super().__init__()
        if not isinstance(stage, int) or not 0 <= stage < stages:
            raise ConfigError(f"stage: must be in 0..{stages - 1}, got {stage!r}", "stage")
        self.config, self.stages, self.stage = config, stages, stage
        self.first, self.last = stage == 0, stage == stages - 1
        gen = torch.Generator().manual_seed(_stage_seed(config.seed, stage))
        if self.first:
            self.tok_emb = nn.Parameter(torch.randn((config.vocab, config.width), generator=gen) * 0.02)
            self.pos_emb = nn.Parameter(torch.randn((config.seq_len, config.width), generator=gen) * 0.02)
        self.blocks = nn.ModuleList(
            Block(config.width, config.heads, gen) for _ in config.stage_layers(stages)[stage]
        )
        if self.last:
            self.lnf = nn.LayerNorm(config.width)
            self.head = _linear(config.width, config.vocab, gen)

    def forward(self, x: Tensor) -> Tensor:
        if self.first:
            x = torch.nn.functional.embedding(x, self.tok_emb) + self.pos_emb[: x.shape[1]]
        for block in self.blocks:
            x = block(x)
        return self.head(self.lnf(x)) if self.last else x

    def flat_parameters(self) -> Tensor:
        """All parameters in one detached vector (for comparing replicas and runs)."""
        return torch.cat([p.detach().reshape(-1) for p in self.parameters()])


def loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean next-token cross-entropy of a micro-batch."""
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def build_stages(config: ModelConfig, stages: int) -> list[StageModule]:
    return [StageModule(config, stages, s) for s in range(stages)]
