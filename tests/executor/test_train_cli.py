"""`recycle train` refuses bad input with one line naming what is wrong (exit 2), before any
service or worker starts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def train(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", "train", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


@pytest.mark.parametrize(("args", "message"), [
    (["--kill", "9:0@1"], "kill: worker 9:0 is outside 3 pipelines x 2 stages"),
    (["--kill", "1:1@3:sideways"], "kill: phase must be one of"),
    (["--kill", "1:1"], "kill: expected P:S@ITER"),
    (["--kill", "1:1@99"], "kill: iteration 99 is outside 0..7"),
    (["--rejoin", "1:1@5"], "rejoin: worker 1:1 has no --kill"),
    (["--kill", "1:1@5", "--rejoin", "1:1@4"], "rejoin: iteration 4 must be after the kill"),
    (["--iterations", "0"], "iterations: must be >= 1"),
    (["--stages", "9"], "stages"),
    (["--job", "/nonexistent/job.json"], "job: cannot read"),
])
def test_bad_input_is_one_clear_line(args, message):
    out = train(*args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def test_a_job_file_of_another_shape_is_refused(tmp_path):
    job = tmp_path / "job.json"
    job.write_text('{"pipelines": 2, "stages": 2, "microbatches": 4, "forward_ms": 1, '
                   '"backward_input_ms": 1, "backward_weight_ms": 1, "p2p_ms": 0.1, "allreduce_ms": 1, '
                   '"optimizer_ms": 1, "activation_mb": 1}')
    out = train("--job", str(job))
    assert out.returncode == 2
    assert "job: " in out.stderr and "[2, 2, 4]" in out.stderr
