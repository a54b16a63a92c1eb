"""The `recycle` dispatcher itself (cli/main.py), run as a separate process as a user runs it."""

from __future__ import annotations

import json
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
