"""`recycle submit` registers a job spec once: re-running it with the same `--job-file` and spec
reuses the job (a restarted container must not fork the job); a changed spec makes a new job; the
file holds exactly the printed id, and `recycle worker --job @FILE` reads it. Bad input: one line,
exit 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from executor.local import uniform_job
from executor.service import ServiceClient

REPO = Path(__file__).resolve().parents[2]


def recycle(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_submit_creates_once_and_reuses_the_job_its_file_names(service, tmp_path):
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(uniform_job(2, 2, 2).filled()))
    job_file = tmp_path / "shared" / "job-id"
    first = recycle("submit", str(spec_file), "--service", service.url, "--job-file", str(job_file),
                    "--precompute", "1")
    assert first.returncode == 0, first.stderr
    job_id = first.stdout.strip()
    assert job_file.read_text().strip() == job_id and "created job" in first.stderr
    held = ServiceClient(service.url)._request("GET", f"/v1/jobs/{job_id}", (200,)).json()["spec"]
    assert held == json.loads(spec_file.read_text())
    again = recycle("submit", str(spec_file), "--service", service.url, "--job-file", str(job_file),
                    "--precompute", "0")
    assert again.returncode == 0 and again.stdout.strip() == job_id and "reusing job" in again.stderr
    spec_file.write_text(json.dumps(uniform_job(2, 2, 4).filled()))
    changed = recycle("submit", str(spec_file), "--service", service.url, "--job-file", str(job_file),
                      "--precompute", "0")
    assert changed.returncode == 0 and changed.stdout.strip() not in ("", job_id)
    assert job_file.read_text().strip() == changed.stdout.strip()


@pytest.mark.parametrize(("args", "message"), [
    (["/nonexistent.json"], "cannot read /nonexistent.json"),
    (["{bad}"], "is not JSON"),
    (["{\"pipelines\": 2}"], "Field required"),
    (["{ok}", "--precompute", "-1"], "--precompute: must be >= 0"),
])
def test_bad_submit_input_is_one_line_exit_2(service, tmp_path, args, message):
    spec_file = tmp_path / "job.json"
    if args[0] == "{ok}":
        spec_file.write_text(json.dumps(uniform_job(2, 2, 2).filled()))
    elif args[0].startswith("{"):
        spec_file.write_text(args[0][1:-1] if args[0] == "{bad}" else args[0])
    first = str(spec_file) if args[0].startswith("{") else args[0]
    out = recycle("submit", first, *args[1:], "--service", service.url)
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and message in out.stderr, out.stderr


def test_worker_job_from_a_missing_file_is_one_line_exit_2(service, tmp_path):
    out = recycle("worker", "--service", service.url, "--job", f"@{tmp_path}/none", "--app",
                  "tests.executor.apps.skipnet:app", "--worker", "0:0", "--store", "127.0.0.1:1")
    assert out.returncode == 2 and f"--job: cannot read {tmp_path}/none" in out.stderr, out.stderr
