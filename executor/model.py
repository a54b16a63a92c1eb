"""A small decoder-only transformer, split by layers into pipeline stages.

Stage 0 holds the token and position embeddings, the last stage the final LayerNorm, the LM head
and the loss; every stage holds a contiguous run of transformer blocks. A stage's parameters are
drawn from a generator seeded by (model seed, stage), so every replica of a stage starts with the
same parameters in any process, and the single-process reference builds exactly the same stages.

Every learnable op goes through `executor.split_backward`, so the same module runs either with a
`WeightGradStore` (B/W split) or without one (ordinary full backward).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

import torch
from torch import Tensor, nn

from executor.split_backward import WeightGradStore, embedding, layer_norm, linear


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


class Block(nn.Module):
    """Pre-LayerNorm block: causal self-attention then a 4x GELU MLP, each with a residual."""

    def __init__(self, width: int, heads: int, gen: torch.Generator):
        super().__init__()
        self.heads = heads
        self.ln1_g, self.ln1_b = _ones(width), _zeros(width)
        # No q/k/v bias: the key bias has an exactly zero gradient (softmax ignores a shift shared by
        # all keys), and AdamW would turn its rounding noise into lr-sized random steps.
        self.qkv_w = _normal((3 * width, width), gen)
        self.proj_w, self.proj_b = _normal((width, width), gen), _zeros(width)
        self.ln2_g, self.ln2_b = _ones(width), _zeros(width)
        self.fc_w, self.fc_b = _normal((4 * width, width), gen), _zeros(4 * width)
        self.out_w, self.out_b = _normal((width, 4 * width), gen), _zeros(width)

    def forward(self, x: Tensor, store: WeightGradStore | None) -> Tensor:
        b, t, c = x.shape
        h = layer_norm(x, self.ln1_g, self.ln1_b, store)
        q, k, v = linear(h, self.qkv_w, None, store).split(c, dim=-1)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        att = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + linear(att.transpose(1, 2).reshape(b, t, c), self.proj_w, self.proj_b, store)
        h = layer_norm(x, self.ln2_g, self.ln2_b, store)
        h = torch.nn.functional.gelu(linear(h, self.fc_w, self.fc_b, store))
        return x + linear(h, self.out_w, self.out_b, store)


class StageModule(nn.Module):
    """One pipeline stage. Input: token ids (stage 0) or hidden states; output: hidden states,
    or on the last stage the mean next-token cross-entropy of the micro-batch."""

    def __init__(self, config: ModelConfig, stages: int, stage: int):
        super().__init__()
        if not isinstance(stage, int) or not 0 <= stage < stages:
            raise ConfigError(f"stage: must be in 0..{stages - 1}, got {stage!r}", "stage")
        self.config, self.stages, self.stage = config, stages, stage
        self.first, self.last = stage == 0, stage == stages - 1
        gen = torch.Generator().manual_seed(_stage_seed(config.seed, stage))
        if self.first:
            self.tok_emb = _normal((config.vocab, config.width), gen)
            self.pos_emb = _normal((config.seq_len, config.width), gen)
        self.blocks = nn.ModuleList(
            Block(config.width, config.heads, gen) for _ in config.stage_layers(stages)[stage]
        )
        if self.last:
            self.lnf_g, self.lnf_b = _ones(config.width), _zeros(config.width)
            self.head_w = _normal((config.vocab, config.width), gen)
            self.head_b = _zeros(config.vocab)

    def forward(
        self, x: Tensor, targets: Tensor | None = None, store: WeightGradStore | None = None
    ) -> Tensor:
        if self.first:
            x = embedding(x, self.tok_emb, self.pos_emb, store)
        for block in self.blocks:
            x = block(x, store)
        if not self.last:
            return x
        if targets is None:
            raise ValueError("the last stage needs the targets to compute the loss")
        logits = linear(layer_norm(x, self.lnf_g, self.lnf_b, store), self.head_w, self.head_b, store)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))

    def flat_parameters(self) -> Tensor:
        """All parameters in one detached vector (for comparing replicas and runs)."""
        return torch.cat([p.detach().reshape(-1) for p in self.parameters()])


def build_stages(config: ModelConfig, stages: int) -> list[StageModule]:
    return [StageModule(config, stages, s) for s in range(stages)]


def _normal(shape: tuple[int, ...], gen: torch.Generator) -> nn.Parameter:
    # GPT-2's initial scale: keeps the residual stream O(1) through a few blocks.
    return nn.Parameter(torch.randn(shape, generator=gen) * 0.02)


def _ones(n: int) -> nn.Parameter:
    return nn.Parameter(torch.ones(n))


def _zeros(n: int) -> nn.Parameter:
    return nn.Parameter(torch.zeros(n))
