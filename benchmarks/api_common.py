"""Shared by the API benchmarks: a service subprocess and a lean asyncio HTTP/1.1 keep-alive client
(httpx costs more CPU per request than the server on a 2-core box, and would measure itself)."""

from __future__ import annotations

import asyncio
import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from executor.service import LocalService, free_port
from executor.service import stop_process as stop_service  # noqa: F401  (the benchmarks hold the process)

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO.parent / "shared" / "scenarios"


def start_service(launcher: tuple[str, ...] = (sys.executable,), **env: str
                  ) -> tuple[subprocess.Popen, str, tempfile.TemporaryDirectory]:
    """`recycle serve` on SQLite in a temporary folder (or `RECYCLE_DATABASE_URL`), with the
    service's own defaults but the access log; `launcher` runs `-m cli.main serve` (e.g. under
    `taskset -c 1`, cProfile). Returns (process, URL, the folder holding `service.log`)."""
    tmp = tempfile.TemporaryDirectory(prefix="recycle-bench-")
    service = LocalService(Path(tmp.name), env, database_url=env.get("RECYCLE_DATABASE_URL")
                           or f"sqlite:///{tmp.name}/bench.db", launcher=launcher,
                           defaults={"RECYCLE_ACCESS_LOG": "false"})
    service.start()
    assert service.proc is not None
    return service.proc, service.url, tmp


@contextlib.contextmanager
def throwaway_postgres():
    """A PostgreSQL cluster in a temporary folder for one run, started as scripts/test.sh starts
    one (initdb refuses root: run it as an unprivileged user); yields its SQLAlchemy URL."""
    initdb = shutil.which("initdb") or sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))[-1]
    bindir = Path(os.path.realpath(initdb)).parent
    tmp = tempfile.mkdtemp(prefix="recycle-pg-")
    runas: list[str] = []
    if os.getuid() == 0:
        if subprocess.run(["id", "recycle-pg"], capture_output=True).returncode != 0:
            subprocess.run(["useradd", "--system", "--no-create-home", "recycle-pg"], check=True)
        shutil.chown(tmp, "recycle-pg")
        runas = ["runuser", "-u", "recycle-pg", "--"]
    port = free_port()
    data = f"{tmp}/data"
    subprocess.run([*runas, f"{bindir}/initdb", "-D", data, "-U", "recycle", "--auth=trust"], check=True,
                   capture_output=True)
    subprocess.run([*runas, f"{bindir}/pg_ctl", "-D", data, "-o", f"-p {port} -k {tmp} -c "
                    "listen_addresses=127.0.0.1", "-l", f"{tmp}/log", "-w", "start"], check=True,
                   capture_output=True)
    try:
        subprocess.run([*runas, f"{bindir}/createdb", "-h", "127.0.0.1", "-p", str(port), "-U", "recycle",
                        "recycle_bench"], check=True, capture_output=True)
        yield f"postgresql+psycopg://recycle@127.0.0.1:{port}/recycle_bench"
    finally:
        subprocess.run([*runas, f"{bindir}/pg_ctl", "-D", data, "-m", "immediate", "stop"],
                       capture_output=True)
        shutil.rmtree(tmp, ignore_errors=True)


class Connection:
    """One keep-alive HTTP/1.1 connection: GET/POST and read one response at a time."""

    def __init__(self, host: str, port: int, headers: dict[str, str] | None = None):
        self.host, self.port = host, port
        self.headers = dict(headers or {})  # sent on every request (a token, a registration id)
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def open(self) -> Connection:
        self.reader, self.writer = await asyncio.open_connection(self.host, self.port)
        return self

    async def request(self, method: str, path: str, body: dict | list | bytes | None = None,
                      headers: dict[str, str] | None = None) -> tuple[int, bytes]:
        """`body` is sent as JSON; bytes as they are (a malformed body)."""
        assert self.reader is not None and self.writer is not None
        payload = body if isinstance(body, bytes) else b"" if body is None else json.dumps(body).encode()
        extra = "".join(f"{k}: {v}\r\n" for k, v in {**self.headers, **(headers or {})}.items())
        head = (f"{method} {path} HTTP/1.1\r\nHost: {self.host}\r\nContent-Length: {len(payload)}\r\n"
                f"Content-Type: application/json\r\n{extra}\r\n")
        self.writer.write(head.encode() + payload)
        status_line = await self.reader.readline()
        status = int(status_line.split()[1])
        length = 0
        while True:
            line = await self.reader.readline()
            if line in (b"\r\n", b""):
                break
            name, _, value = line.partition(b":")
            if name.lower() == b"content-length":
                length = int(value)
        return status, await self.reader.readexactly(length) if length else b""

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()


def host_port(url: str) -> tuple[str, int]:
    host, port = url.removeprefix("http://").split(":")
    return host, int(port)


def scenario(name: str, **overrides) -> dict:
    return {**json.loads((SCENARIOS / name).read_text()), **overrides}


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def run_loop(coro):
    """Run the load generator on uvloop when installed (it is the service's loop too, via uvicorn)."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(coro)
    return uvloop.run(coro)
