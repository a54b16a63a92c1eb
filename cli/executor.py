"""`recycle profile`: the executor's command line.

`register` only defines arguments: cli/main.py imports this module for every `recycle` call, so
torch is imported inside the command. Bad input (a model option out of range, more stages than
layers, an unwritable output) ends in one line on stderr naming the option and exit code 2.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import NoReturn

EXIT_OK, EXIT_INPUT = 0, 2


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "profile", help="Measure a model on this machine and write a job spec for the planner.",
        description="Measures, per stage, the forward (F), input-gradient (B) and weight-gradient (W) "
        "time of one micro-batch, the AdamW step, the activation memory one micro-batch holds, the "
        "loopback P2P transfer of one activation and the stage's gradient all-reduce over D ranks, "
        "and writes the job spec JSON (shared/docs/contracts.md) the planner reads.",
    )
    _one_line_errors(p, "profile")
    _layout_options(p, pipelines=2)
    model_options(p)
    p.add_argument("--reps", type=int, default=10, help="timed repetitions per figure (default 10)")
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="where to measure (default cpu)")
    p.add_argument("-o", "--output", metavar="FILE", help="write the job spec here instead of stdout")
    p.set_defaults(run=cmd_profile)
    _register_train(subparsers)
    from cli.worker import register as register_worker

    register_worker(subparsers, _one_line_errors)
    from cli.submit import register as register_submit

    register_submit(subparsers, _one_line_errors)


def _register_train(subparsers: argparse._SubParsersAction) -> None:
    t = subparsers.add_parser(
        "train", help="Train on a local cluster of worker processes, with injected failures and rejoins.",
        description="Starts the plan service (unless --service), registers the job (profiled here, or "
        "--job), precomputes plans, launches D x S CPU worker processes that follow the service's "
        "membership generations, trains N iterations and prints loss, measured vs predicted "
        "iteration time, generation, and recovery time per failure.",
    )
    _one_line_errors(t, "train")
    _layout_options(t, pipelines=3)
    t.add_argument("--iterations", "-N", type=int, default=8, help="training iterations (default 8)")
    model_options(t)
    t.add_argument("--kill", action="append", default=[], metavar="P:S@ITER[:PHASE]",
                   help="SIGKILL worker P:S when it reaches PHASE (forward, backward_input, backward_weight, "
                   "allreduce, optimizer; default forward) of iteration ITER; repeatable")
    t.add_argument("--rejoin", action="append", default=[], metavar="P:S@ITER",
                   help="restart killed worker P:S; it rejoins at iteration ITER; repeatable")
    t.add_argument("--service", metavar="URL", help="use this plan service instead of starting one (its "
                   "admin token from RECYCLE_TOKEN or RECYCLE_TOKEN_FILE)")
    t.add_argument("--job", metavar="FILE", help="job spec JSON to plan with instead of profiling")
    t.add_argument("--reps", type=int, default=5, help="profile repetitions per figure (default 5)")
    t.add_argument("--solve-time-limit", type=float, default=2.0,
                   help="planner time limit per failure set for the started service (default 2 s)")
    t.add_argument("--precompute-timeout", type=float, default=120.0,
                   help="longest wait for the plan precompute (default 120 s; later plans solve on demand)")
    t.add_argument("--timeout", type=float, default=600.0, help="bound on the whole run (default 600 s)")
    t.add_argument("--report", metavar="FILE", help="write iterations, failures and parameter norms as JSON")
    t.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="cpu (gloo) or cuda (NCCL; one GPU per worker on this host)")
    from cli.worker import checkpoint_options

    checkpoint_options(t)
    t.add_argument("--check-exact", action="store_true",
                   help="afterwards, train the same model without failures in this one process and say "
                   "whether every iteration's loss is equal (relative 1e-5)")
    t.set_defaults(run=_cmd_train)


def _cmd_train(args: argparse.Namespace) -> int:
    from cli.train import cmd_train

    return cmd_train(args)


def _one_line_errors(parser: argparse.ArgumentParser, name: str) -> None:
    """argparse's own errors as one line naming the command, exit code 2 (like every input error)."""

    def fail(message: str) -> NoReturn:
        print(f"recycle {name}: error: {message} (see recycle {name} --help)", file=sys.stderr)
        raise SystemExit(EXIT_INPUT)

    parser.error = fail  # type: ignore[method-assign]


def _layout_options(parser: argparse.ArgumentParser, pipelines: int) -> None:
    parser.add_argument("--pipelines", "-D", type=int, default=pipelines,
                        help=f"data-parallel degree D (default {pipelines})")
    parser.add_argument("--stages", "-S", type=int, default=2, help="pipeline depth S (default 2)")
    parser.add_argument("--microbatches", "-M", type=int, default=4,
                        help="micro-batches per pipeline per iteration (default 4)")


def model_options(p: argparse.ArgumentParser) -> None:
    """The model and data options shared by every executor command."""
    p.add_argument("--app", metavar="MODULE:ATTR",
                   help="train your own model: a zero-argument factory returning build_stage, dataset, "
                   "microbatch_size, loss and optimizer (contracts.md 'Training app'; e.g. "
                   "examples.gpt:app). Without it, the built-in toy transformer below")
    p.add_argument("--layers", type=int, default=4, help="transformer blocks in the model (default 4)")
    p.add_argument("--width", type=int, default=32, help="hidden size (default 32)")
    p.add_argument("--heads", type=int, default=2, help="attention heads, must divide width (default 2)")
    p.add_argument("--vocab", type=int, default=64, help="vocabulary size (default 64)")
    p.add_argument("--seq-len", type=int, default=16, help="tokens per sample (default 16)")
    p.add_argument("--seed", type=int, default=0, help="parameter and data seed (default 0)")
    p.add_argument("--batch-size", type=int, default=2, help="samples per micro-batch (default 2)")
    p.add_argument("--text-file", metavar="FILE", help="train on windows of this text file (default: "
                   "synthetic sequences)")


def cmd_profile(args: argparse.Namespace) -> int:
    from executor.data import DataConfig
    from executor.model import ConfigError, ModelConfig
    from executor.profile import profile_job
    from planner.spec import SpecError

    if args.app:
        return _profile_app(args)
    try:
        for name in ("pipelines", "stages", "microbatches"):
            if getattr(args, name) < 1:
                raise ConfigError(f"{name}: must be >= 1, got {getattr(args, name)}", name)
        model = ModelConfig(layers=args.layers, width=args.width, heads=args.heads, vocab=args.vocab,
                            seq_len=args.seq_len, seed=args.seed)
        data = DataConfig(batch_size=args.batch_size, text_file=args.text_file)
        spec = profile_job(
            model, args.pipelines, args.stages, args.microbatches, data, args.reps, args.device
        )
    except (ConfigError, SpecError, RuntimeError) as exc:
        print(f"recycle profile: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    return _write_spec(spec, args.output)


def _profile_app(args: argparse.Namespace) -> int:
    from executor.app import AppError, load_app, validate_app
    from executor.app_profile import profile_app
    from planner.spec import SpecError

    try:
        for name in ("pipelines", "stages", "microbatches", "reps"):
            if getattr(args, name) < 1:
                raise AppError(f"{name}: must be >= 1, got {getattr(args, name)}")
        app = load_app(args.app)
        validate_app(app, args.stages)
        spec = profile_app(app, args.pipelines, args.stages, args.microbatches, args.reps, args.device)
    except (AppError, SpecError, RuntimeError) as exc:
        print(f"recycle profile: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    return _write_spec(spec, args.output)


def _write_spec(spec: dict, output: str | None) -> int:
    text = json.dumps(spec, indent=2) + "\n"
    if output:
        try:
            Path(output).write_text(text)
        except OSError as exc:
            print(f"recycle profile: error: cannot write {output}: {exc.strerror}", file=sys.stderr)
            return EXIT_INPUT
        print(f"wrote {output}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    print(COMMS_NOTE, file=sys.stderr)
    return EXIT_OK


COMMS_NOTE = ("note: p2p_ms, cross_pipeline_p2p_ms and allreduce_ms were measured over gloo between "
              "threads of this process, on the CPU, whatever --device says; for NCCL over your "
              "interconnect, replace them in the JSON with figures measured there (e.g. nccl-tests)")
