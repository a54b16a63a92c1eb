"""`recycle plan | simulate | precompute` run as a user runs them: a separate process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
UNIFORM = REPO.parent / "shared" / "scenarios" / "uniform-4x4x8.json"
JOB = {"pipelines": 2, "stages": 3, "microbatches": 4, "forward_ms": 2.0, "backward_input_ms": 2.0,
       "backward_weight_ms": 1.0, "p2p_ms": 0.5, "cross_pipeline_p2p_ms": 1.0, "allreduce_ms": 3.0,
       "optimizer_ms": 1.0, "activation_mb": 1.0}


def recycle(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *map(str, args)], cwd=REPO,
                          capture_output=True, text=True, timeout=timeout, env={**os.environ})


@pytest.fixture(scope="module")
def job_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "job.json"
    path.write_text(json.dumps(JOB))
    return path


@pytest.fixture(scope="module")
def plan_file(job_file) -> Path:
    out = job_file.with_name("plan.json")
    done = recycle("plan", job_file, "--fail", "1:1", "--no-cp", "-o", out)
    assert done.returncode == 0, done.stderr
    return out


def test_plan_writes_a_timeline_and_summarises(job_file, plan_file):
    timeline = json.loads(plan_file.read_text())
    assert timeline["format"] == "recycle.timeline/v1" and timeline["failed"] == [[1, 1]]
    assert timeline["iteration_ms"] >= timeline["lower_bound_ms"]
    done = recycle("plan", job_file, "--fail", "1:1", "--no-cp", "--format", "summary")
    summary = json.loads(done.stdout)
    assert summary["iteration_ms"] == timeline["iteration_ms"]
    assert summary["failure_class"] == "0:1"
    for word in ("failure class 0:1", "iteration", "fault-free", "bound", "gap", "status", "wall"):
        assert word in done.stderr


def test_fast_timeline_text_is_the_contract_document(failed_plan, fault_free_plan):
    from cli.timeline_text import timeline_text

    for result in (failed_plan, fault_free_plan):
        assert json.loads(timeline_text(result)) == result.timeline_json()


def test_simulate_a_valid_plan(plan_file):
    done = recycle("simulate", plan_file, "--jitter", "0.1", "--seed", "3", "--iterations", "20")
    assert done.returncode == 0, done.stderr
    timeline = json.loads(plan_file.read_text())
    assert "valid: all six rules hold" in done.stdout
    assert f"period (replayed) {timeline['iteration_ms']:.3f} ms" in done.stdout
    assert "DIFFERS" not in done.stdout
    assert "jitter (seed 3, 20 iterations)" in done.stdout
    assert "[0, 1]" in done.stdout and "[1, 1]" not in done.stdout.split("busy ms")[1]


def test_simulate_reports_each_violation(plan_file, tmp_path):
    timeline = json.loads(plan_file.read_text())
    op = next(o for o in timeline["ops"] if o["kind"] == "W")
    op["end_ms"] += 0.25
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(timeline))
    done = recycle("simulate", bad)
    assert done.returncode == 1
    assert "INVALID" in done.stdout and "rule 2: W on" in done.stdout


def drop_first_forward(timeline):
    timeline["ops"] = [o for o in timeline["ops"] if o["kind"] != "F" or o["microbatch"] != [0, 0]]


def shrink_job(timeline):
    timeline["job"]["stages"] = 2  # the ops still name stage 2


@pytest.mark.parametrize(
    ("corrupt", "violation"),
    [(drop_first_forward, "lacks ['F']"), (shrink_job, "rule 1: op on unknown worker [0, 2]")],
)
def test_simulate_an_unreplayable_plan_without_traceback(plan_file, tmp_path, corrupt, violation):
    timeline = json.loads(plan_file.read_text())
    corrupt(timeline)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(timeline))
    done = recycle("simulate", bad)
    assert done.returncode == 1
    assert violation in done.stdout and "cannot replay" in done.stdout
    assert "Traceback" not in done.stderr


def test_plan_formats(job_file, tmp_path):
    chrome = recycle("plan", job_file, "--fail", "0:2", "--no-cp", "--format", "chrome")
    assert chrome.returncode == 0 and json.loads(chrome.stdout)["traceEvents"]
    csv = recycle("plan", job_file, "--no-cp", "--format", "csv")
    rows = csv.stdout.strip().split("\n")
    assert csv.returncode == 0 and len(rows) == JOB["stages"] and rows[0].startswith("0F0,")
    png = tmp_path / "plan.png"
    gantt = recycle("plan", job_file, "--fail", "0:2", "--no-cp", "--format", "gantt", "-o", png)
    assert gantt.returncode == 0, gantt.stderr
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_precompute_is_resumable(tmp_path):
    out = tmp_path / "plans"
    first = recycle("precompute", UNIFORM, "--max-failures", "1", "-o", out, "--no-cp")
    assert first.returncode == 0, first.stderr
    index = json.loads((out / "index.json").read_text())
    # 4 x 4 workers, at most one failure: 17 raw failure sets, 5 classes (none, or stage s failed).
    assert set(index["classes"]) == {"none", "0:0", "0:1", "0:2", "0:3"}
    assert "5 canonical failure classes" in first.stderr and "17 raw failure sets" in first.stderr
    entry = index["classes"]["0:2"]
    assert set(entry) >= {"file", "iteration_ms", "bound_ms", "gap", "status"}
    assert json.loads((out / entry["file"]).read_text())["failed"] == [[0, 2]]

    (out / entry["file"]).unlink()
    again = recycle("precompute", UNIFORM, "--max-failures", "1", "-o", out, "--no-cp")
    assert again.returncode == 0
    assert "4 already planned" in again.stderr and "1 to plan" in again.stderr
    assert (out / entry["file"]).is_file()

    # Plans written after the last index checkpoint (here: all of them) are recovered, not redone.
    (out / "index.json").unlink()
    recovered = recycle("precompute", UNIFORM, "--max-failures", "1", "-o", out, "--no-cp")
    assert "5 already planned" in recovered.stderr and "0 to plan" in recovered.stderr
    assert json.loads((out / "index.json").read_text())["classes"] == index["classes"]


def test_precompute_refuses_another_jobs_directory(job_file, tmp_path):
    out = tmp_path / "plans"
    assert recycle("precompute", UNIFORM, "--max-failures", "0", "-o", out, "--no-cp").returncode == 0
    done = recycle("precompute", job_file, "--max-failures", "0", "-o", out, "--no-cp")
    assert done.returncode == 2 and "different job spec" in done.stderr


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["plan", "missing.json"], "missing.json: no such file"),
        (["plan", "{bad}"], "invalid JSON at line 1"),
        (["plan", "{spec}"], "forward_ms"),
        (["plan", "{job}", "--fail", "1-1"], "--fail '1-1': expected PIPELINE:STAGE"),
        (["plan", "{job}", "--fail", "5:0"], "pipeline 5 is out of range 0..1"),
        (["plan", "{job}", "--fail", "0:1,1:1"], "stage 1 has no surviving peer"),
        (["plan", "{job}", "--format", "gantt"], "give -o FILE.png"),
        (["plan", "{job}", "--fail", "0:1", "--format", "csv"], "plan without --fail"),
        (["plan", "{job}", "--time-limit", "-1"], "--time-limit"),
        (["plan", "{job}", "--format", "svg"], "invalid choice: 'svg'"),
        (["simulate", "{job}"], "is a job spec, not a plan timeline"),
        (["simulate", "{plan}", "--jitter", "1.5"], "--jitter"),
        (["precompute", "{job}", "--max-failures", "-1", "-o", "{tmp}"], "--max-failures"),
        (["precompute", "{job}", "-o", "{tmp}"], "--max-failures"),
        (["plan", "{huge}"], "microbatches: job too large to plan"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(args, message, job_file, plan_file, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps({**JOB, "forward_ms": -1}))
    huge = tmp_path / "huge.json"
    huge.write_text(json.dumps({**JOB, "pipelines": 1, "stages": 64, "microbatches": 100_000}))
    names = {"{job}": job_file, "{plan}": plan_file, "{bad}": bad, "{spec}": spec, "{tmp}": tmp_path / "o",
             "{huge}": huge}
    done = recycle(*[str(names.get(a, a)) for a in args])
    assert done.returncode == 2, (done.stdout, done.stderr)
    lines = done.stderr.strip().split("\n")
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"recycle {args[0]}: error:") and message in lines[0]


@pytest.mark.parametrize(
    ("command", "options"),
    [
        ("plan", ["--fail", "--time-limit", "--no-cp", "--seed", "--format", "--output"]),
        ("simulate", ["--jitter", "--seed", "--iterations"]),
        ("precompute", ["--max-failures", "--output", "--time-limit", "--no-cp"]),
    ],
)
def test_help_explains_every_option(command, options):
    done = recycle(command, "--help")
    assert done.returncode == 0
    for option in options:
        assert option in done.stdout


def test_simulate_given_a_job_spec_says_what_to_run_instead(tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"pipelines": 2, "stages": 2, "microbatches": 2, "forward_ms": 1.0,
                               "backward_input_ms": 1.0, "backward_weight_ms": 1.0, "p2p_ms": 0.1,
                               "allreduce_ms": 1.0, "optimizer_ms": 1.0, "activation_mb": 1.0}))
    proc = subprocess.run([sys.executable, "-m", "cli.main", "simulate", str(job)], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "is a job spec, not a plan timeline" in proc.stderr
    assert f"recycle plan {job}" in proc.stderr


def test_version_flag_prints_the_package_version():
    from importlib.metadata import version

    proc = subprocess.run([sys.executable, "-m", "cli.main", "--version"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0 and proc.stdout.strip() == f"recycle {version('recycle')}"
