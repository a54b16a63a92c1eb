"""Helpers for the API tests: `recycle serve` in a subprocess on a free loopback port, httpx over
the socket, SQLite always and PostgreSQL when RECYCLE_TEST_POSTGRES_URL is set (scripts/test.sh).

A module with a unique name (tests run in importlib mode): conftest puts this folder on sys.path."""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from executor.service import LocalService, free_port  # noqa: F401 - free_port for the tests

REPO = Path(__file__).resolve().parents[2]
SCENARIOS = REPO.parent / "shared" / "scenarios"
POSTGRES_URL = os.environ.get("RECYCLE_TEST_POSTGRES_URL")

UNIFORM = {
    "pipelines": 4, "stages": 4, "microbatches": 8, "forward_ms": 10.0, "backward_input_ms": 10.0,
    "backward_weight_ms": 10.0, "p2p_ms": 0.5, "cross_pipeline_p2p_ms": 0.75, "allreduce_ms": 20.0,
    "optimizer_ms": 2.0, "activation_mb": 1.0,
}


def wait_for(predicate, timeout_s: float, what: str):
    """Poll `predicate` until it returns something true (returned), failing after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    value = None
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}: {value}")


def small_job(pipelines: int = 4, stages: int = 4, microbatches: int = 8) -> dict:
    return {**UNIFORM, "pipelines": pipelines, "stages": stages, "microbatches": microbatches}


class Server(LocalService):
    """One `recycle serve` process; `kill9` and `start` again on the same database."""

    def __init__(self, database_url: str, log_path: Path, **env: str):
        super().__init__(Path(log_path).parent, env, database_url=database_url, log_path=log_path,
                         defaults={"RECYCLE_USE_CP": "false", "RECYCLE_SOLVE_TIME_LIMIT_S": "2",
                                   "RECYCLE_ACCESS_LOG": "false", "PYTHONUNBUFFERED": "1"})

    def client(self, **kwargs) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=30, **kwargs)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=10)


def _postgres_schema_url() -> Iterator[str]:
    """A fresh schema per server in the throw-away cluster, so tests never see each other's rows."""
    from sqlalchemy import create_engine, text

    schema = f"t_{uuid.uuid4().hex[:12]}"
    admin = create_engine(POSTGRES_URL)
    with admin.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA {schema}"))
    sep = "&" if "?" in POSTGRES_URL else "?"
    try:
        yield f"{POSTGRES_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP SCHEMA {schema} CASCADE"))
        admin.dispose()


STORES = [
    pytest.param("sqlite", id="sqlite"),
    pytest.param("postgres", id="postgres", marks=[
        pytest.mark.postgres,
        pytest.mark.skipif(not POSTGRES_URL, reason="RECYCLE_TEST_POSTGRES_URL is not set: scripts/test.sh "
                           "starts a throw-away PostgreSQL 15 cluster and sets it")]),
]


def database_for(kind: str, tmp_path: Path) -> Iterator[str]:
    if kind == "sqlite":
        yield f"sqlite:///{tmp_path / 'recycle.db'}"
    else:
        yield from _postgres_schema_url()


def create_job(client: httpx.Client, spec: dict | None = None) -> str:
    r = client.post("/v1/jobs", json=spec or small_job())
    assert r.status_code == 201, r.text
    return r.json()["id"]


def wait_plan(client: httpx.Client, job_id: str, failed: list, timeout_s: float = 60) -> dict:
    r = client.post(f"/v1/jobs/{job_id}/plans", json={"failed": failed, "wait_s": 30})
    deadline = time.monotonic() + timeout_s
    while r.status_code == 202 and time.monotonic() < deadline:
        time.sleep(0.2)
        r = client.get(r.headers["Location"])
        if r.json()["status"] != "pending":
            break
    assert r.status_code == 200 and r.json()["status"] == "done", r.text
    return r.json()


def metric(client: httpx.Client, name: str) -> float:
    total = 0.0
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name) and not line.startswith("#"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def load_scenario(name: str) -> dict:
    return json.loads((SCENARIOS / name).read_text())
