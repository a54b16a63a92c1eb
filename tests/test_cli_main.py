"""The `recycle` dispatcher itself (cli/main.py), run as a separate process as a user runs it."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
JOB = {"pipelines": 2, "stages": 2, "microbatches": 4, "forward_ms": 2.0, "backward_input_ms": 2.0,
       "backward_weight_ms": 1.0, "p2p_ms": 0.5, "cross_pipeline_p2p_ms": 1.0, "allreduce_ms": 3.0,
       "optimizer_ms": 1.0, "activation_mb": 1.0}


def test_a_reader_that_leaves_early_gets_no_traceback(tmp_path):
    """`recycle plan ... | head -0`: the pipe is closed before the command writes its timeline."""
    job = tmp_path / "job.json"
    job.write_text(json.dumps(JOB))
    proc = subprocess.Popen([sys.executable, "-m", "cli.main", "plan", str(job), "--no-cp"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    _, stderr = proc.communicate(timeout=120)
    stderr = stderr.decode()
    assert "Traceback" not in stderr and "BrokenPipeError" not in stderr, stderr
    assert proc.returncode == 141, (proc.returncode, stderr)


def test_every_command_help_ends_with_an_example_that_parses():
    from cli.main import EXAMPLES, build_parser

    parser = build_parser()
    commands = parser._subparsers._group_actions[0].choices  # every registered subcommand
    assert set(commands) == set(EXAMPLES)
    for name, sub in commands.items():
        assert sub.epilog == f"Example: {EXAMPLES[name]}"
        words = shlex.split(EXAMPLES[name])
        argv = words[words.index("recycle") + 1:]  # after any VAR=value prefix
        assert argv[0] == name
        assert parser.parse_args(argv).command == name  # a flag that does not exist exits 2 here


def test_the_planner_examples_run_as_written(tmp_path):
    """plan -> simulate -> precompute exactly as their --help shows them, from a folder beside
    ../shared as the repository root is."""
    from cli.main import EXAMPLES

    (tmp_path / "shared").symlink_to(REPO.parent / "shared")
    work = tmp_path / "repo"
    work.mkdir()
    for name in ("plan", "simulate", "precompute"):
        words = shlex.split(EXAMPLES[name])
        out = subprocess.run([sys.executable, "-m", "cli.main", *words[1:]], cwd=work, capture_output=True,
                             text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO)})
        assert out.returncode == 0, (name, out.stderr)
    assert json.loads((work / "plan.json").read_text())["iteration_ms"] > 0
    assert any((work / "plans").iterdir())
