"""Issue 9, finding 4: creation is idempotent (`Idempotency-Key`), an error never closes the
keep-alive connection, and an unreachable database answers 503 + Retry-After (not 500)."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from urllib.parse import urlsplit

import pytest
from api_testkit import POSTGRES_URL, Server, create_job, database_for, small_job

PROBLEM = "application/problem+json"


class KeepAlive:
    """One raw HTTP/1.1 connection: every request goes over the same socket, or the test fails."""

    def __init__(self, url: str, timeout_s: float = 30):
        parts = urlsplit(url)
        self.sock = socket.create_connection((parts.hostname, parts.port), timeout=timeout_s)
        self.buffer = b""

    def request(self, method: str, path: str, body: dict | None = None) -> tuple[int, dict, bytes]:
        data = b"" if body is None else json.dumps(body).encode()
        head = f"{method} {path} HTTP/1.1\r\nHost: test\r\nContent-Length: {len(data)}\r\n"
        if body is not None:
            head += "Content-Type: application/json\r\n"
        self.sock.sendall(head.encode() + b"\r\n" + data)
        while b"\r\n\r\n" not in self.buffer:
            self._read(f"{method} {path}: the connection closed before a response")
        raw, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
        lines = raw.decode("latin-1").split("\r\n")
        status = int(lines[0].split()[1])
        headers = {k.strip().lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
        length = int(headers.get("content-length", "0"))
        while len(self.buffer) < length:
            self._read(f"{method} {path}: the connection closed mid-body")
        payload, self.buffer = self.buffer[:length], self.buffer[length:]
        assert headers.get("connection", "").lower() != "close", (status, headers)
        return status, headers, payload

    def _read(self, why: str) -> None:
        chunk = self.sock.recv(65536)
        assert chunk, why
        self.buffer += chunk

    def close(self) -> None:
        self.sock.close()


def test_job_creation_with_an_idempotency_key_happens_once(client):
    spec = small_job(2, 2, 4)
    key = {"Idempotency-Key": "create-once-7f3a"}
    before = client.get("/v1/jobs", params={"limit": 1}).json()["total"]
    first = client.post("/v1/jobs", json=spec, headers=key)
    assert first.status_code == 201 and "idempotent-replayed" not in first.headers, first.text
    # A client that lost the answer retries, eight at once: all get the same job, none a new one.
    with ThreadPoolExecutor(8) as pool:
        again = list(pool.map(lambda _: client.post("/v1/jobs", json=spec, headers=key), range(8)))
    for r in again:
        assert r.status_code == 201 and r.headers["idempotent-replayed"] == "true", r.text
        assert r.json() == first.json() and r.headers["location"] == first.headers["location"]
    assert client.get("/v1/jobs", params={"limit": 1}).json()["total"] == before + 1
    # New keys racing each other each create exactly one job.
    with ThreadPoolExecutor(8) as pool:
        raced = list(pool.map(lambda i: client.post("/v1/jobs", json=spec,
                                                    headers={"Idempotency-Key": f"race-{i % 2}"}), range(8)))
    assert len({r.json()["id"] for r in raced}) == 2
    assert client.get("/v1/jobs", params={"limit": 1}).json()["total"] == before + 3
    # The same key with another spec is a client mistake, named.
    other = client.post("/v1/jobs", json=small_job(2, 2, 6), headers=key)
    assert other.status_code == 422 and other.json()["field"] == "Idempotency-Key", other.text


def test_a_key_whose_job_was_deleted_creates_nothing_again(client):
    """A create retried - or a dropped request's twin arriving late - after its job was deleted must
    not make a second job for the key (benchmarks/api_abuse.py found such a job: stored, never
    answered to anyone). The key stays bound to the deleted job: 410, and no job is made."""
    spec = small_job(2, 2, 4)
    key = {"Idempotency-Key": "deleted-then-retried-41c2"}
    first = client.post("/v1/jobs", json=spec, headers=key)
    assert first.status_code == 201, first.text
    assert client.delete(first.headers["location"]).status_code == 204
    before = client.get("/v1/jobs", params={"limit": 1}).json()["total"]
    for _ in range(2):
        again = client.post("/v1/jobs", json=spec, headers=key)
        assert again.status_code == 410, again.text
        assert again.headers["content-type"] == PROBLEM and again.json()["field"] == "Idempotency-Key"
        assert first.json()["id"] in again.json()["detail"]
    # Another spec under the key is still the client mistake it always was.
    assert client.post("/v1/jobs", json=small_job(2, 2, 6), headers=key).status_code == 422
    assert client.get("/v1/jobs", params={"limit": 1}).json()["total"] == before
    # A new key creates as usual.
    fresh = client.post("/v1/jobs", json=spec, headers={"Idempotency-Key": "deleted-then-new-41c2"})
    assert fresh.status_code == 201 and fresh.json()["id"] != first.json()["id"]


def test_an_internal_error_keeps_the_connection_open(server, client):
    """A job row the service cannot read (corrupted in the database) is a 500 problem; the same
    connection then serves the next request."""
    from sqlalchemy import create_engine, text

    job_id = create_job(client, small_job(2, 2, 4))
    engine = create_engine(server.database_url)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO jobs (id, spec, pipelines, stages, microbatches, created_at) "
                              "VALUES ('corrupt0', '{\"pipelines\": \"x\"}', 1, 1, 1, 0)"))
        conn_ = KeepAlive(server.url)
        try:
            for _ in range(3):
                status, headers, body = conn_.request("GET", "/v1/jobs/corrupt0")
                assert status == 500 and headers["content-type"] == PROBLEM, body
                status, _, body = conn_.request("GET", f"/v1/jobs/{job_id}")
                assert status == 200 and json.loads(body)["id"] == job_id
        finally:
            conn_.close()
    finally:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM jobs WHERE id = 'corrupt0'"))
        engine.dispose()


class Proxy:
    """A TCP forwarder on a fixed loopback port in front of the database, to pull the plug."""

    def __init__(self, target: tuple[str, int]):
        self.target = target
        probe = socket.socket()
        probe.bind(("127.0.0.1", 0))
        self.port = probe.getsockname()[1]
        probe.close()
        self.listener: socket.socket | None = None
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()

    def up(self) -> None:
        self.listener = socket.socket()
        self.listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.listener.bind(("127.0.0.1", self.port))
        self.listener.listen(64)
        threading.Thread(target=self._accept, args=(self.listener,), daemon=True).start()

    def down(self) -> None:
        """Refuse new connections and cut every open one."""
        assert self.listener is not None
        # shutdown wakes the thread blocked in accept() (a bare close() leaves the socket listening)
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        with self.lock:
            for s in self.open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
            self.open.clear()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                client, _ = listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(self.target, timeout=10)
            upstream.settimeout(None)
            with self.lock:
                self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        try:
            while chunk := src.recv(65536):
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)


@pytest.mark.postgres
@pytest.mark.skipif(not POSTGRES_URL, reason="needs RECYCLE_TEST_POSTGRES_URL (a database to unplug)")
def test_an_unreachable_database_answers_503_with_retry_after(tmp_path):
    from sqlalchemy.engine import make_url

    urls = database_for("postgres", tmp_path)
    real = make_url(next(urls))
    proxy = Proxy((real.host, real.port))
    proxy.up()
    server = Server(real.set(port=proxy.port).render_as_string(hide_password=False), tmp_path / "server.log")
    try:
        server.start()
        with server.client() as c:
            job_id = create_job(c, small_job(2, 2, 4))
        conn = KeepAlive(server.url)
        try:
            proxy.down()
            for method, path, body in (("GET", "/v1/jobs", None), ("POST", "/v1/jobs", small_job(2, 2, 4)),
                                       ("POST", f"/v1/jobs/{job_id}/plans", {"failed": [[0, 0]]}),
                                       ("GET", "/v1/jobs/nosuchjob", None), ("GET", "/healthz", None)):
                status, headers, payload = conn.request(method, path, body)
                assert status == 503, (method, path, status, payload)
                assert headers["content-type"] == PROBLEM and int(headers["retry-after"]) >= 1
            proxy.up()
            assert conn.request("GET", "/healthz")[0] == 200
            status, _, payload = conn.request("GET", "/v1/jobs")
            assert status == 200 and json.loads(payload)["total"] == 1, payload
        finally:
            conn.close()
    finally:
        server.stop()
        proxy.down()
        for _ in urls:
            pass


def test_schema_v7_keeps_the_keys_of_a_v6_database(tmp_path):
    """The v7 rebuild of `idempotency_keys` (no foreign key) carries every stored key over."""
    from sqlalchemy import text

    from api.db import MIGRATIONS, make_engine, migrate, schema_table

    engine = make_engine(f"sqlite:///{tmp_path / 'v6.db'}")
    try:
        with engine.begin() as conn:
            schema_table.create(conn)
            conn.execute(schema_table.insert().values(version=6))
            for version, step in MIGRATIONS:
                if version <= 6:
                    step(conn)
            conn.execute(text("INSERT INTO jobs (id, spec, pipelines, stages, microbatches, created_at) "
                              "VALUES ('j6', '{}', 1, 1, 1, 0)"))
            conn.execute(text("INSERT INTO idempotency_keys (key, job_id, request_sha256, created_at) "
                              "VALUES ('k6', 'j6', 'd', 0)"))
        assert migrate(engine) == 7
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM jobs WHERE id = 'j6'"))  # no cascade any more
            assert conn.execute(text("SELECT key, job_id FROM idempotency_keys")).all() == [("k6", "j6")]
    finally:
        engine.dispose()
