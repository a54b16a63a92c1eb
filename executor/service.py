"""The plan service as the executor's launchers use it: a local `recycle serve` subprocess and a
small httpx client for jobs, precompute and failure reports (HTTP only; no `api` import)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent

FAST_COORDINATOR = {"RECYCLE_HEARTBEAT_INTERVAL_S": "0.25", "RECYCLE_HEARTBEAT_TIMEOUT_S": "1.5"}
"""Heartbeat settings for local training: a hung worker is declared failed within 1.5 s (+0.25 s
watchdog period), inside the 2 s detection bar. Broken connections are reported faster still."""


TRAINING = {"RECYCLE_ACCESS_LOG": "false", "RECYCLE_LOG_LEVEL": "WARNING", **FAST_COORDINATOR}
"""What a training launcher's service runs with: quiet logs, fast failure detection."""


class ServiceError(RuntimeError):
    """The service could not be started, reached, or refused a request (the message says why)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen) -> None:
    """SIGTERM (the service answers open long-polls and closes its database), SIGKILL after 15 s."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)


class LocalService:
    """`recycle serve` on 127.0.0.1 and a free port, by default with an embedded SQLite database in
    `workdir`: the one way the launchers, the API tests and the API benchmarks start a service."""

    def __init__(self, workdir: Path, env: dict[str, str] | None = None, database_url: str | None = None,
                 launcher: tuple[str, ...] = (sys.executable,), log_path: Path | None = None,
                 defaults: dict[str, str] | None = None):
        """`env` may set `RECYCLE_API_TOKEN` (then `token` holds it, for the launcher's client);
        `launcher` runs `-m cli.main serve` (e.g. under `taskset`); the log goes to `log_path`;
        `defaults` (settings `env` may override) default to the training launchers' `TRAINING`."""
        self.workdir = Path(workdir)
        self.database_url = database_url or f"sqlite:///{self.workdir / 'recycle.db'}"
        self.launcher = tuple(launcher)
        self.log_path = Path(log_path) if log_path else self.workdir / "service.log"
        self.env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get(
            "PYTHONPATH")])), **(TRAINING if defaults is None else defaults), **(env or {})}
        self.token: str | None = self.env.get("RECYCLE_API_TOKEN") or None
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def start(self, timeout_s: float = 60.0) -> LocalService:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [*self.launcher, "-m", "cli.main", "serve", "--host", "127.0.0.1", "--port", str(port),
                 "--database-url", self.database_url], cwd=REPO, env=self.env, stdout=log,
                stderr=subprocess.STDOUT)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                code = self.proc.returncode
                raise ServiceError(f"recycle serve exited with code {code}:\n{self.log_tail()}")
            try:
                if httpx.get(self.url + "/healthz", timeout=1).status_code == 200:
                    return self
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        self.stop()
        raise ServiceError(f"recycle serve was not healthy within {timeout_s:.0f} s:\n{self.log_tail()}")

    def log_tail(self, chars: int = 2000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:] if self.log_path.exists() else ""

    def stop(self) -> None:
        if self.proc is not None:
            stop_process(self.proc)

    def __enter__(self) -> LocalService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


class ServiceClient:
    def __init__(self, url: str, token: str | None = None, timeout_s: float = 30.0):
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.http = httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)
        self.url = url

    def _request(self, method: str, path: str, expect: tuple[int, ...], **kw) -> httpx.Response:
        try:
            resp = self.http.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise ServiceError(f"service at {self.url} unreachable: {exc}") from exc
        if resp.status_code not in expect:
            try:
                detail = resp.json().get("detail", resp.text)
            except ValueError:
                detail = resp.text[:300]
            raise ServiceError(f"{method} {path}: {resp.status_code}: {detail}")
        return resp

    def create_job(self, spec: dict[str, Any]) -> str:
        return self._request("POST", "/v1/jobs", (201,), json=spec).json()["id"]

    def precompute(self, job_id: str, max_failures: int, timeout_s: float) -> dict[str, Any]:
        """Start the precompute of every failure class up to `max_failures` and wait for it (bounded:
        on timeout it keeps running in the service and plans not ready are solved on demand)."""
        op = self._request("POST", f"/v1/jobs/{job_id}/precompute", (202,),
                           json={"max_failures": max_failures}).json()
        deadline = time.monotonic() + timeout_s
        while op["status"] in ("pending", "running") and time.monotonic() < deadline:
            time.sleep(0.2)
            op = self._request("GET", f"/v1/operations/{op['id']}", (200,)).json()
        return op

    def report_failure(self, job_id: str, worker: tuple[int, int], reason: str) -> None:
        self._request("POST", f"/v1/jobs/{job_id}/failures", (200,),
                      json={"worker": list(worker), "reason": reason})

    def worker_token(self, job_id: str) -> str | None:
        """The job's worker token (admin token needed): all its worker processes need; None when the
        service runs without authentication."""
        return self._request("GET", f"/v1/jobs/{job_id}", (200,)).json().get("worker_token")

    def membership(self, job_id: str) -> dict[str, Any]:
        return self._request("GET", f"/v1/jobs/{job_id}/membership", (200,)).json()

    def set_rendezvous(self, job_id: str, address: str) -> None:
        self._request("PUT", f"/v1/jobs/{job_id}/rendezvous", (200,), json={"address": address})

    def rendezvous(self, job_id: str, wait_s: float) -> str:
        """The job's store address as the service has it; waits (bounded) for `recycle rendezvous
        --service` to register one, since workers and the store may start in any order."""
        deadline = time.monotonic() + wait_s
        while True:
            resp = self._request("GET", f"/v1/jobs/{job_id}/rendezvous", (200, 404))
            if resp.status_code == 200:
                return resp.json()["address"]
            if time.monotonic() > deadline:
                raise ServiceError(f"job {job_id}: no rendezvous store registered at {self.url} within "
                                   f"{wait_s:g} s (start `recycle rendezvous --service URL --job JOB`, "
                                   "or give --store)")
            time.sleep(0.5)

    def close(self) -> None:
        self.http.close()
