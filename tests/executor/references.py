"""The tiny model the executor's training tests run, and its single-process reference training,
computed once per test process (`train_reference` is deterministic: same config, same result)."""

from __future__ import annotations

import functools

import torch

from executor.model import ModelConfig
from executor.reference import train_reference


def tiny(stages: int) -> ModelConfig:
    return ModelConfig(layers=2 * stages, width=32, heads=2, vocab=64, seq_len=16, seed=1)


@functools.cache
def reference(pipelines: int, stages: int, microbatches: int, iterations: int):
    """Plain single-process training on the same global batches the cluster trains on."""
    torch.set_num_threads(1)
    return train_reference(tiny(stages), stages, pipelines, microbatches, iterations)
