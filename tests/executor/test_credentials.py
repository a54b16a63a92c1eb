"""Scoped credentials on the executor side (issue 9, finding 10): the launchers hold the admin token,
their worker processes only the job's worker token, which reaches that job's coordinator routes and
nothing else. The worker token is checked against the one the service mints (read with the admin
token), and its reach against the service itself."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from executor.cluster import LiveCluster
from executor.local import uniform_job
from executor.model import ModelConfig
from executor.service import LocalService, ServiceClient

REPO = Path(__file__).resolve().parents[2]
ADMIN = "admin-token-for-the-credentials-test"


@pytest.fixture(scope="module")
def secured(tmp_path_factory):
    env = {"RECYCLE_USE_CP": "false", "RECYCLE_SOLVE_TIME_LIMIT_S": "2", "RECYCLE_API_TOKEN": ADMIN}
    with LocalService(tmp_path_factory.mktemp("secured"), env) as service:
        yield service


def _reach(url: str, token: str, job: str) -> tuple[int, int]:
    """(status of the job's membership route, status of the admin job listing) with `token`."""
    headers = {"Authorization": f"Bearer {token}"}
    member = httpx.get(f"{url}/v1/jobs/{job}/membership", headers=headers, timeout=10).status_code
    admin = httpx.get(f"{url}/v1/jobs", headers=headers, timeout=10).status_code
    return member, admin


@pytest.mark.slow
def test_live_cluster_workers_hold_the_job_worker_token_not_the_admin_token(secured, tmp_path, monkeypatch):
    torch.set_num_threads(1)
    client = ServiceClient(secured.url, ADMIN)
    job = client.create_job(uniform_job(2, 1, 2).filled())
    client.precompute(job, 0, timeout_s=60)
    monkeypatch.setenv("RECYCLE_KEEP_RUN_DIR", str(tmp_path))  # keep the worker specs to read them
    model = ModelConfig(layers=1, width=16, heads=2, vocab=32, seq_len=8, seed=1)
    run = LiveCluster(secured.url, job, 2, 1, 2, 1, model, token=ADMIN, timeout_s=120,
                      operation_timeout_s=30).run()
    assert len(run.losses) == 1  # trained through the authenticated service
    specs = [json.loads(p.read_text()) for p in tmp_path.glob("recycle-live-*/worker-*.json")]
    assert len(specs) == 2
    minted = client.worker_token(job)
    assert minted and minted != ADMIN
    assert {s["service_token"] for s in specs} == {minted}
    assert _reach(secured.url, minted, job) == (200, 403)


def test_submit_writes_the_worker_token_owner_readable_and_workers_read_it_from_a_file(secured, tmp_path):
    spec_file = tmp_path / "job.json"
    spec_file.write_text(json.dumps(uniform_job(2, 2, 2).filled()))
    token_file = tmp_path / "shared" / "worker-token"
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "submit", str(spec_file), "--service", secured.url, "--precompute",
         "0", "--worker-token-file", str(token_file)], cwd=REPO, capture_output=True, text=True, timeout=60,
        env={**os.environ, "RECYCLE_TOKEN": ADMIN})
    assert out.returncode == 0, out.stderr
    job = out.stdout.strip()
    assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
    token = token_file.read_text().strip()
    assert token == ServiceClient(secured.url, ADMIN).worker_token(job) != ADMIN
    assert _reach(secured.url, token, job) == (200, 403)
    # `recycle worker` authenticates with the file's token: it gets as far as the app (none here).
    worker = subprocess.run(
        [sys.executable, "-m", "cli.main", "worker", "--service", secured.url, "--job", job, "--app",
         "no_such_module:app", "--worker", "0:0", "--store", "127.0.0.1:1"], cwd=REPO, capture_output=True,
        text=True, timeout=60, env={**os.environ, "RECYCLE_TOKEN_FILE": str(token_file)})
    assert worker.returncode == 2 and "no_such_module" in worker.stderr, worker.stderr


@pytest.mark.parametrize("contents", [None, ""], ids=["missing", "empty"])
def test_a_bad_token_file_is_one_line_exit_2(secured, tmp_path, contents):
    path = tmp_path / "token"
    if contents is not None:
        path.write_text(contents)
    out = subprocess.run(
        [sys.executable, "-m", "cli.main", "worker", "--service", secured.url, "--job", "j", "--app",
         "tests.executor.apps.skipnet:app", "--worker", "0:0", "--store", "127.0.0.1:1"], cwd=REPO,
        capture_output=True, text=True, timeout=60, env={**os.environ, "RECYCLE_TOKEN_FILE": str(path)})
    assert out.returncode == 2, out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "RECYCLE_TOKEN_FILE" in out.stderr, out.stderr
