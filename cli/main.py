"""The `recycle` console script: a thin dispatcher.

`cli/` holds every command's argument parsing and output; the packages hold the logic the commands
call (planner/, evaluation/, api/, executor/ never import cli/, tests/test_layout.py). Each module
here registers its subcommands with argument definitions only: the heavy imports (OR-Tools,
FastAPI, torch) happen inside the command that needs them, so `recycle --help` and `recycle plan`
never load torch or the web stack.

    plan.py, precompute.py   recycle plan | simulate | precompute
    serve.py                 recycle serve
    executor.py              recycle profile | train, and registers worker.py, rendezvous, submit.py
    train.py                 recycle train's run and its summary table
    bench.py                 recycle bench
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# modules with `register(subparsers)`; a part whose import fails for a missing optional package is
# skipped so the planner works on an install without the api/executor extras.
_PARTS = ("cli.plan", "cli.serve", "cli.executor", "cli.bench")


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("recycle")
    except PackageNotFoundError:  # run from a source tree without an install
        return "unknown (not installed)"


EXAMPLES = {
    "plan": "recycle plan ../shared/scenarios/uniform-4x4x8.json --fail 1:2 --time-limit 2 -o plan.json",
    "simulate": "recycle simulate plan.json --jitter 0.1",
    "precompute": "recycle precompute ../shared/scenarios/uniform-4x4x8.json --max-failures 1 --no-cp "
                  "-o plans/",
    "serve": "RECYCLE_API_TOKEN=$(openssl rand -hex 16) recycle serve --port 8000 --database-url "
             "sqlite:///recycle.db",
    "profile": "recycle profile --app examples.conv:app --pipelines 2 --stages 3 -o job.json",
    "train": "recycle train --app examples.gpt:app --pipelines 3 --stages 2 --microbatches 4 --iterations 8 "
             "--kill 1:1@3:forward --rejoin 1:1@6 --check-exact",
    "worker": "RECYCLE_TOKEN_FILE=/shared/worker-token recycle worker --service http://10.0.0.1:8000 --job "
              "@/shared/job-id --app examples.gpt:app --worker 0:1 --store 10.0.0.1:29400",
    "rendezvous": "RECYCLE_TOKEN_FILE=/shared/worker-token recycle rendezvous --port 29400 --service "
                  "http://10.0.0.1:8000 --job @/shared/job-id",
    "submit": "RECYCLE_TOKEN=$ADMIN recycle submit job.json --service http://10.0.0.1:8000 --job-file "
              "/shared/job-id --worker-token-file /shared/worker-token",
    "bench": "recycle bench --suite gpt-8x8x24 -o out/gpt",
}
"""One working example per command, shown at the end of its --help (tests/test_cli_main.py parses
each, and runs the planner's, from the repository root)."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="recycle",
        description="Keep pipeline-parallel training at full speed when workers fail: plan, serve, "
        "train and evaluate bubble-filling schedules.",
    )
    parser.add_argument("--version", action="version", version=f"recycle {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in _PARTS:
        try:
            module = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name and name.startswith(exc.name):
                continue
            raise
        module.register(sub)
    for name, command in sub.choices.items():
        command.epilog = f"Example: {EXAMPLES[name]}"
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code = int(args.run(args) or 0)
        sys.stdout.flush()  # inside the try: a reader that left shows up here, not at exit
        return code
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (`recycle bench | head`): not an error of ours. Point stdout at /dev/null
        # so the interpreter's final flush does not raise again, and exit as `yes | head` does.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141


if __name__ == "__main__":
    sys.exit(main())
