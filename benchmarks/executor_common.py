"""Shared by the executor benchmarks: the built-in model's size flags, one set of defaults (a model
large enough that per-op Python overhead does not dominate on a CPU core)."""

from __future__ import annotations

import argparse


def model_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)


def model_fields(args: argparse.Namespace) -> dict:
    """The `ModelConfig` keyword arguments the flags give."""
    return {"layers": args.layers, "width": args.width, "heads": args.heads, "vocab": args.vocab,
            "seq_len": args.seq_len}
