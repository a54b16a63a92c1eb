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
    (["--stage-lost-wait", "0"], "--stage-lost-wait: must be > 0 seconds"),
])
def test_bad_input_is_one_clear_line(args, message):
    out = train(*args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr
    assert "Traceback" not in out.stderr


def _cuda_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.skipif(_cuda_gpus() >= 6, reason="this host has a GPU for each of the 6 workers: cuda is valid")
def test_cuda_without_a_gpu_per_worker_is_one_clear_line():
    out = train("--device", "cuda", "--stage-lost-wait", "5")
    assert out.returncode == 2, out.stderr
    want = ("device: cuda was asked for but torch sees no CUDA device" if _cuda_gpus() == 0
            else "device: cuda needs one GPU per worker (6 workers)")
    assert want in out.stderr and "Traceback" not in out.stderr


def test_a_job_file_of_another_shape_is_refused(tmp_path):
    job = tmp_path / "job.json"
    job.write_text('{"pipelines": 2, "stages": 2, "microbatches": 4, "forward_ms": 1, '
                   '"backward_input_ms": 1, "backward_weight_ms": 1, "p2p_ms": 0.1, "allreduce_ms": 1, '
                   '"optimizer_ms": 1, "activation_mb": 1}')
    out = train("--job", str(job))
    assert out.returncode == 2
    assert "job: " in out.stderr and "[2, 2, 4]" in out.stderr


def test_the_table_marks_kills_rejoins_and_a_checkpoint_restore():
    """A hand-written report: both stage-1 workers killed in iteration 3, the job restored from
    checkpoint step-2 when 0:1 came back (generation 4), and 1:1 back at iteration 4 (generation 5)."""
    from cli.train import _events

    kill = {"phase": "backward_input", "iteration": 3, "recovery_ms": None, "detected_ms": None}
    report = {
        "failure_details": [{**kill, "worker": [1, 1]}, {**kill, "worker": [0, 1]}],
        "generations": [{"generation": 1, "failed": [], "restart": 0, "restored": None},
                        {"generation": 4, "failed": [[1, 1]], "restart": 2, "restored": 2},
                        {"generation": 5, "failed": [], "restart": 4, "restored": None}],
    }
    assert _events(report) == {
        3: ["worker 1:1 killed (backward_input)", "worker 0:1 killed (backward_input)"],
        2: ["worker 0:1 rejoined", "a stage had lost every worker: all restored checkpoint step-2"],
        4: ["worker 1:1 rejoined"],
    }
    # The usual case: one kill, the worker failed for a generation, then back.
    report["generations"] = [{"generation": 1, "failed": [], "restart": 0},
                             {"generation": 2, "failed": [[1, 1]], "restart": 3},
                             {"generation": 3, "failed": [], "restart": 6}]
    report["failure_details"] = report["failure_details"][:1]
    assert _events(report) == {3: ["worker 1:1 killed (backward_input)"], 6: ["worker 1:1 rejoined"]}


def test_measured_vs_predicted_says_which_way_they_differ():
    from cli.train import measured_vs_predicted

    slower = [{"iteration_ms": 200.0, "predicted_ms": 100.0}, {"iteration_ms": 50.0, "predicted_ms": 100.0},
              {"iteration_ms": 150.0, "predicted_ms": 100.0}, {"iteration_ms": 9.0, "predicted_ms": None}]
    line = measured_vs_predicted(slower, 6, 2)  # ratios 0.5, 1.5, 2.0: median 1.5
    assert "median 1.50x" in line and "6 worker processes share 2 CPU cores" in line, line
    faster = [{"iteration_ms": r * 100.0, "predicted_ms": 100.0} for r in (0.5, 0.6, 0.9)]
    line = measured_vs_predicted(faster, 6, 2)
    assert "median 0.60x" in line and "faster than its profile" in line, line
    line = measured_vs_predicted(slower, 1, 2)  # one process on two cores: no sharing to blame
    assert "median 1.50x" in line and "share" not in line and "does not time" in line, line


@pytest.mark.parametrize("app", [None, "an app"])
def test_the_run_is_profiled_on_the_device_it_trains_on(monkeypatch, app):
    """`recycle train --device cuda` once profiled on the CPU and planned a GPU run from CPU
    timings (found on an H100: measured 83-95 ms against a predicted 31.6, the CPU's figure)."""
    import argparse

    import executor.app_profile
    import executor.profile
    from cli.train import _job_spec

    seen = []
    monkeypatch.setattr(executor.app_profile, "profile_app", lambda *a: seen.append(a[-1]) or {})
    monkeypatch.setattr(executor.profile, "profile_job", lambda *a: seen.append(a[-1]) or {})
    args = argparse.Namespace(job=None, device="cuda", reps=1, pipelines=1, stages=1, microbatches=1)
    _job_spec(args, None, None, app)
    assert seen == ["cuda"]
