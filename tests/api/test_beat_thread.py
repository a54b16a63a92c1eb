"""The heartbeat thread (`api.beat_loop`): a keep-alive connection that carried a head-answered beat
is served by a second event loop on its own thread, so its beats are answered while the main loop
is busy; whatever that thread does not answer goes back to the main loop, bytes and order intact.

The server (the real app, `cli.serve`'s protocol and heartbeat thread, uvloop) runs in a thread of
this process, so a test can block the main event loop for real: a connection to a second listener
on the same loop whose `data_received` waits on an event. Every wait here has a timeout."""

from __future__ import annotations

import asyncio
import json
import select
import socket
import threading
import time

import httpx
import pytest
import uvicorn
from api_testkit import free_port, wait_for

from api.main import create_app
from api.settings import Settings
from cli.serve import http_protocol, server_class

uvloop = pytest.importorskip("uvloop")

TOKEN = "beat-thread-test-secret-0123456789"
KEEP_ALIVE_S = 1.5
HEADER_TIMEOUT_S = 1.0


class Blocker(asyncio.Protocol):
    """Blocks the loop that reads it until `release` is set (at most 30 s)."""
    blocked = threading.Event()
    release = threading.Event()

    def data_received(self, data: bytes) -> None:
        Blocker.blocked.set()
        Blocker.release.wait(30)


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("beats")
    port = free_port()
    settings = Settings(database_url=f"sqlite:///{tmp / 'b.db'}", port=port, use_cp=False,
                        api_token=TOKEN, heartbeat_interval_s=1.0, heartbeat_timeout_s=60.0,
                        register_timeout_s=600.0, header_timeout_s=HEADER_TIMEOUT_S,
                        log_level="WARNING", access_log=False)
    app = create_app(settings)
    http, beat_loop = http_protocol(app, settings, keep_alive_s=KEEP_ALIVE_S)
    assert beat_loop is not None  # on by default
    server = server_class()(uvicorn.Config(app, host="127.0.0.1", port=port, http=http, lifespan="on",
                                           log_level="warning", timeout_keep_alive=KEEP_ALIVE_S))
    server.beat_loop = beat_loop
    beat_loop.start(server.server_state)
    loop = uvloop.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    wait_for(lambda: server.started, 60, "the server to start")
    blocker = asyncio.run_coroutine_threadsafe(loop.create_server(Blocker, "127.0.0.1", 0), loop).result(10)
    # A fresh connection per admin request: with the server's 1.5 s keep-alive an idle pooled one
    # can be closed by the server just as the next request goes out ("Server disconnected without
    # sending a response", seen once in CI after the GIL-holding test).
    admin = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30,
                         headers={"Authorization": f"Bearer {TOKEN}"},
                         limits=httpx.Limits(max_keepalive_connections=0))
    try:
        yield {"port": port, "beat_loop": beat_loop, "admin": admin, "server": server, "thread": thread,
               "blocker_port": blocker.sockets[0].getsockname()[1]}
    finally:
        Blocker.release.set()
        admin.close()
        server.should_exit = True
        thread.join(30)
        beat_loop.stop()


def _job() -> dict:
    return {"pipelines": 2, "stages": 2, "microbatches": 4, "forward_ms": 10.0, "backward_input_ms": 10.0,
            "backward_weight_ms": 10.0, "p2p_ms": 0.5, "allreduce_ms": 20.0, "optimizer_ms": 2.0,
            "activation_mb": 1.0}


class Daemon:
    """A worker daemon's heartbeat connection, spoken by hand (raw HTTP/1.1 over one socket)."""

    def __init__(self, service, job: dict, worker: tuple[int, int]):
        self.job_id, self.worker = job["id"], worker
        self.token = job["worker_token"]
        registered = httpx.post(f"http://127.0.0.1:{service['port']}{self.path}", json={"pid": 4242},
                                headers={"Authorization": f"Bearer {self.token}"}, timeout=30)
        assert registered.status_code == 200, registered.text
        self.registration = registered.json()["registration"]
        self.sock = socket.create_connection(("127.0.0.1", service["port"]), timeout=10)
        self.pending = b""

    @property
    def path(self) -> str:
        return f"/v1/jobs/{self.job_id}/workers/{self.worker[0]}/{self.worker[1]}/heartbeat"

    def beat_bytes(self, body: bytes | None = None) -> bytes:
        head = (f"POST {self.path} HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {self.token}\r\n"
                f"x-recycle-registration: {self.registration}\r\n")
        if body is None:
            return (head + "content-length: 0\r\n\r\n").encode()
        head += f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        return head.encode() + body

    def response(self, timeout_s: float = 10.0) -> tuple[int, dict, dict]:
        """The next whole response: status, headers, JSON body."""
        self.sock.settimeout(timeout_s)
        while b"\r\n\r\n" not in self.pending:
            self._read()
        head, _, rest = self.pending.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = dict((k.strip().lower(), v.strip()) for k, v in (line.split(":", 1) for line in lines[1:]))
        length = int(headers["content-length"])
        while len(rest) < length:
            self._read()
            rest = self.pending.partition(b"\r\n\r\n")[2]
        self.pending = rest[length:]
        return int(lines[0].split()[1]), headers, json.loads(rest[:length])

    def _read(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the server closed the connection")
        self.pending += data

    def beat(self) -> dict:
        self.sock.sendall(self.beat_bytes())
        status, _, body = self.response()
        assert status == 200, body
        return body


def _new_job(service) -> dict:
    created = service["admin"].post("/v1/jobs", json=_job())
    assert created.status_code == 201, created.text
    return created.json()


def _adopted(service, daemon: Daemon) -> None:
    """Beat until the heartbeat thread serves this connection (at most 10 s)."""
    beat_loop = service["beat_loop"]
    before = beat_loop.adopted
    body = daemon.beat()
    assert body["worker"] == list(daemon.worker) and body["excluded"] is False
    wait_for(lambda: beat_loop.adopted > before, 10, "the heartbeat thread to adopt the connection")


def test_an_adopted_connection_is_answered_while_the_main_loop_is_blocked(service):
    job = _new_job(service)
    daemon = Daemon(service, job, (0, 1))
    _adopted(service, daemon)
    answered = service["beat_loop"].answered
    Blocker.blocked.clear()
    Blocker.release.clear()
    with socket.create_connection(("127.0.0.1", service["blocker_port"]), timeout=10) as blocker:
        blocker.sendall(b"block")
        assert Blocker.blocked.wait(10), "the main loop did not read the blocking connection"
        try:
            # The main loop is blocked now: only the heartbeat thread can answer.
            for _ in range(3):
                body = daemon.beat()
                assert body["job_id"] == job["id"] and body["worker"] == [0, 1]
                assert body["generation"] == 1 and body["excluded"] is False
            assert not Blocker.release.is_set()
        finally:
            Blocker.release.set()
    assert service["beat_loop"].answered == answered + 3
    # The main loop runs again and the beat it could not see was recorded by the thread.
    membership = service["admin"].get(f"/v1/jobs/{job['id']}/membership").json()
    assert [0, 1] not in membership["failed"]


def test_requests_the_thread_does_not_answer_go_back_to_the_app_in_order(service):
    job = _new_job(service)
    daemon = Daemon(service, job, (1, 0))
    _adopted(service, daemon)
    beat_loop = service["beat_loop"]
    handed_back = beat_loop.handed_back
    # One write: a beat (the thread), then what only the app answers, then beats again.
    daemon.sock.sendall(daemon.beat_bytes() + b"GET /healthz HTTP/1.1\r\nhost: t\r\n\r\n"
                        + daemon.beat_bytes(b'{"pid": 4242}') + daemon.beat_bytes())
    first = daemon.response()
    health = daemon.response()
    with_body = daemon.response()
    last = daemon.response()
    assert first[0] == 200 and first[2]["worker"] == [1, 0]
    assert health[0] == 200 and health[2]["status"] == "ok"
    assert with_body[0] == 200 and with_body[2]["worker"] == [1, 0]
    assert last[0] == 200 and last[2]["worker"] == [1, 0]
    assert beat_loop.handed_back == handed_back + 1
    # Back on the main loop the connection stays there and keeps working.
    assert daemon.beat()["worker"] == [1, 0]


def test_a_beat_of_a_deleted_job_is_answered_by_the_app(service):
    job = _new_job(service)
    daemon = Daemon(service, job, (0, 0))
    _adopted(service, daemon)
    assert service["admin"].delete(f"/v1/jobs/{job['id']}").status_code == 204
    daemon.sock.sendall(daemon.beat_bytes())
    status, headers, body = daemon.response()
    assert status == 404 and headers["content-type"] == "application/problem+json", body


def test_an_oversized_head_on_an_adopted_connection_gets_431(service):
    job = _new_job(service)
    daemon = Daemon(service, job, (1, 1))
    _adopted(service, daemon)
    daemon.sock.sendall(daemon.beat_bytes()[:-2] + b"x-pad: " + b"a" * 70_000 + b"\r\n\r\n")
    status, headers, body = daemon.response()
    assert status == 431 and headers["connection"] == "close", body


def test_a_partial_head_times_out_with_408_and_an_idle_connection_closes(service):
    job = _new_job(service)
    stalled, idle = Daemon(service, job, (0, 0)), Daemon(service, job, (0, 1))
    _adopted(service, stalled)
    _adopted(service, idle)
    # A client trickling its head one byte at a time is timed from the head's first byte.
    head = stalled.beat_bytes()
    started = time.monotonic()
    stalled.sock.sendall(head[:40])
    for byte in head[40:80]:  # 40 x 0.1 s: four times the timeout
        ready, _, _ = select.select([stalled.sock], [], [], 0.1)
        if ready:
            break
        stalled.sock.sendall(bytes([byte]))
    answered_after_s = time.monotonic() - started
    status, headers, body = stalled.response(timeout_s=HEADER_TIMEOUT_S + 10)
    assert status == 408 and "RECYCLE_HEADER_TIMEOUT_S" in body["detail"]
    assert HEADER_TIMEOUT_S * 0.9 <= answered_after_s < 3 * HEADER_TIMEOUT_S, answered_after_s
    idle.sock.settimeout(KEEP_ALIVE_S + 10)
    assert idle.sock.recv(1) == b"", "an idle adopted connection outlived the keep-alive timeout"


def test_the_metrics_count_the_threads_work(service):
    text = service["admin"].get("/metrics").text
    values = {line.split("{count=\"")[1].split("\"")[0]: float(line.split()[-1])
              for line in text.splitlines() if line.startswith("recycle_beat_thread{")}
    beat_loop = service["beat_loop"]
    assert values["adopted"] == beat_loop.adopted >= 1
    assert values["answered"] == beat_loop.answered >= 3
    assert values["handed_back"] == beat_loop.handed_back >= 1
    assert values["connections"] == len(beat_loop.connections)


def test_the_thread_counts_how_late_it_ran_while_the_gil_was_held(service):
    """A C call that never lets the GIL go (summing a range) stops every thread: the heartbeat
    thread's own tick says it ran that late (what a beat arriving then waited)."""
    beat_loop = service["beat_loop"]
    over_100ms = beat_loop.late_over_100ms
    started = time.monotonic()
    total = sum(range(60_000_000))  # holds the GIL for its whole length
    held_s = time.monotonic() - started
    assert total > 0 and held_s > 0.3, f"the GIL was held {held_s:.2f} s only: not a test of lateness"
    wait_for(lambda: beat_loop.late_over_100ms > over_100ms, 10, "the tick to count the hold")
    assert beat_loop.late_max_ms > 100


def test_stopping_the_server_closes_the_threads_connections_and_ends_it(service):
    """Last in this module: it stops the module's server."""
    daemon = Daemon(service, _new_job(service), (0, 0))
    _adopted(service, daemon)
    service["server"].should_exit = True
    service["thread"].join(30)
    assert not service["thread"].is_alive(), "the server did not stop within 30 s"
    assert not service["beat_loop"].thread.is_alive()
    daemon.sock.settimeout(10)
    try:
        data = daemon.sock.recv(1)
    except ConnectionResetError:
        data = b""  # closed with unread bytes: a reset is a close too
    assert data == b"", "an adopted connection outlived the server"
