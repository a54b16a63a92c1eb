"""`recycle profile` writes a job spec the planner accepts, and refuses bad options in one line."""

from __future__ import annotations

import json

import pytest

from cli.main import main
from executor.model import ModelConfig
from executor.profile import profile_job
from planner.solve import plan
from planner.spec import JobSpec


def test_profiled_spec_is_a_plannable_job():
    spec = profile_job(ModelConfig(layers=2, width=16, heads=2, vocab=32, seq_len=8), 2, 2, 2, reps=1)
    job = JobSpec.parse(spec)
    assert (job.pipelines, job.stages, job.microbatches) == (2, 2, 2)
    for key in ("forward_ms", "backward_input_ms", "backward_weight_ms", "optimizer_ms", "allreduce_ms",
                "activation_mb"):
        assert len(spec[key]) == 2 and all(v > 0 for v in spec[key]), key
    assert spec["p2p_ms"] > 0
    assert plan(job, failed=((0, 1),), use_cp=False).iteration_ms > 0


def test_profile_cli_writes_the_spec(tmp_path, capsys):
    out = tmp_path / "job.json"
    rc = main(["profile", "-D", "1", "-S", "1", "-M", "2", "--layers", "1", "--width", "16", "--vocab", "32",
               "--seq-len", "8", "--reps", "1", "-o", str(out)])
    assert rc == 0
    spec = json.loads(out.read_text())
    assert spec["allreduce_ms"] == [0.0]  # one pipeline: nothing to all-reduce
    JobSpec.parse(spec)
    # The communication figures are loopback gloo on the CPU: the user is told so, and what to do.
    assert "measured over gloo between threads" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "message"),
    [(["--heads", "3"], "heads"), (["--layers", "1", "-S", "2"], "layers"), (["-M", "0"], "microbatches"),
     (["--batch-size", "0"], "batch_size"), (["--text-file", "/no/such/file"], "text_file")],
)
def test_profile_cli_bad_options_name_the_field(capsys, argv, message):
    assert main(["profile", "--reps", "1", *argv]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_registering_the_commands_does_not_import_torch():
    import subprocess
    import sys

    code = "import sys, cli.main; cli.main.build_parser(); print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False"


def test_app_profile_measures_memory_held_from_f_to_b_and_from_b_to_w():
    """Hand-worked, fp32, a (64, 256) micro-batch: every activation below is 64 x 256 x 4 B = 0.0625 MB.

    Middle stage `Linear(256, 256, bias=False) -> GELU`: F saves the Linear's input and the GELU's
    input and sends the output: 3 x 0.0625 = 0.1875 MB from F to B. B frees the GELU's input; W
    still needs the Linear's input and the gradient of its output: 2 x 0.0625 = 0.125 MB from B to W.

    First stage `Linear(256, 256, bias=False)` on raw data: the input has no gradient, so B does
    nothing and W, the whole backward, needs the input and the received output gradient: 0.125 MB
    from F to B (input + output) and 0.125 MB from B to W."""
    import types

    import torch

    from executor.app_profile import profile_app_stage

    app = types.SimpleNamespace(loss=lambda out, target: out.mean(),
                                optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    torch.manual_seed(0)
    middle = torch.nn.Sequential(torch.nn.Linear(256, 256, bias=False), torch.nn.GELU())
    row = profile_app_stage(app, middle, 1, 3, (torch.randn(64, 256),), None, 2, torch.device("cpu"))
    assert row["activation_mb"] == pytest.approx(0.1875)
    assert row["activation_w_mb"] == pytest.approx(0.125)

    first = torch.nn.Linear(256, 256, bias=False)
    row = profile_app_stage(app, first, 0, 2, torch.randn(64, 256), None, 2, torch.device("cpu"))
    assert row["activation_mb"] == pytest.approx(0.125)
    assert row["activation_w_mb"] == pytest.approx(0.125)


def test_app_profile_times_only_the_ops_not_its_memory_accounting(monkeypatch):
    """F, B and W are timed around the runner's calls only. A fake clock that advances only while
    gc.collect() runs (the accounting between B and W) must leave every timed op at 0 ms: when W's
    window also covered the accounting, W read 1000 ms here (and 100-340 ms of real gc time in
    benchmarks/executor_iteration.py, making the plan's prediction 3-4x the measured iteration)."""
    import gc
    import types

    import torch

    import executor.app_profile as app_profile

    clock = [0.0]
    real_collect = gc.collect

    def slow_collect(*args):
        clock[0] += 1.0
        return real_collect(*args)

    monkeypatch.setattr(app_profile.time, "perf_counter", lambda: clock[0])
    monkeypatch.setattr(app_profile.gc, "collect", slow_collect)
    app = types.SimpleNamespace(loss=lambda out, target: out.mean(),
                                optimizer=lambda params: torch.optim.SGD(params, lr=0.1))
    middle = torch.nn.Sequential(torch.nn.Linear(8, 8, bias=False), torch.nn.GELU())
    row = app_profile.profile_app_stage(app, middle, 1, 3, (torch.randn(4, 8),), None, 3,
                                        torch.device("cpu"))
    assert (row["F"], row["B"], row["W"], row["optimizer"]) == (0.0, 0.0, 0.0, 0.0)
