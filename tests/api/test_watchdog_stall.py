"""A live worker whose beat sits unread in the server's socket buffer while the server's own loop
is stalled must not be declared failed (issue 9: "the watchdog can declare workers that a
saturated loop has not read as failed").

The server (the real app, protocol and uvloop, on 127.0.0.1) runs in a thread of this process so
the test can stall its event loop for real: a connection to a second listener on the same loop
whose `data_received` blocks, i.e. a stall in the loop's I/O phase, as a long request handler is.
With heartbeats every 3.0 s and a timeout of 4.5 s, the worker's last beat is read, the loop
stalls 2.5 s later, the worker's next beat is written to its socket during the stall, and the
stall lasts until 4.8 s after that last read beat: when the loop comes back, a live worker's beat
is waiting. The stall (2.3 s) is shorter than one heartbeat interval, so the watchdog does not take
it for a stall of the service (`Membership.excuse`), and libuv runs due timers before it polls the
sockets again: the watchdog judged the silence before the waiting beat was read, and declared the
worker failed.

The order of events is forced, not timed: the stall waits until the beat has been written before
it ends, so a slow box can only make the stall start later (shorter), never let the beat miss it.
An earlier version beat from a thread on a 3 s timer and failed once in CI's full suite.

The second test begins the stall inside the watchdog's own yield to the sockets
(`coordination.read_waiting_beats`, wrapped here only to write the stalling bytes at that moment):
the poll that the yield was for finds the stalling connection, takes its list of ready sockets,
and stalls; the beat written meanwhile is not on that list. A watchdog that yielded once judged
the silence as soon as the stall ended and declared the worker failed; this once failed CI's full
suite (the stall began there by chance)."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time
from dataclasses import dataclass, field

import httpx
import pytest
import uvicorn

from api import coordination
from api.fastpath import HeadBeats
from api.main import create_app
from api.protocol import guarded_protocol
from api.settings import Settings

uvloop = pytest.importorskip("uvloop")

INTERVAL, TIMEOUT, STALL_AFTER, SILENCE = 3.0, 4.5, 2.5, 4.8
# The loop stalls STALL_AFTER after the last read beat and comes back SILENCE after it: the
# silence outlasts the timeout by 0.3 s, and the stall (at most SILENCE - STALL_AFTER = 2.3 s) is
# shorter than INTERVAL, so it is not excused as a stall of the service.


@dataclass
class Gate:
    """What the test and the stalling connection share (one per test run)."""

    started: threading.Event = field(default_factory=threading.Event)
    armed: threading.Event = field(default_factory=threading.Event)
    """Set by the test when the watchdog's next yield should begin the stall (second test)."""
    staller: socket.socket | None = None
    beat_written: threading.Event = field(default_factory=threading.Event)
    until: float = 0.0
    """Monotonic time before which the stall does not end."""
    began: float = 0.0
    ended: float = 0.0


class Stall(asyncio.Protocol):
    """Blocks the loop from the moment its connection's data is read until the beat has been
    written (`gate.beat_written`) and `gate.until` has passed."""

    def __init__(self, gate: Gate):
        self.gate = gate

    def data_received(self, data: bytes) -> None:
        self.gate.began = time.monotonic()
        self.gate.started.set()
        self.gate.beat_written.wait(30)
        time.sleep(max(0.0, self.gate.until - time.monotonic()))
        self.gate.ended = time.monotonic()


def test_a_beat_waiting_unread_through_a_short_stall_is_not_silence(tmp_path):
    _beat_through_a_stall(tmp_path, Gate(), in_the_watchdogs_yield=False)


def test_a_stall_that_begins_inside_the_watchdogs_yield_is_waited_out(tmp_path, monkeypatch):
    gate = Gate()
    real = coordination.read_waiting_beats

    async def stall_in_the_yield(period: float, tries: int = 3) -> None:
        if gate.armed.is_set() and gate.staller is not None:
            # Readable before the yield polls: the loop's next poll reads it and stalls.
            gate.staller.sendall(b"stall")
            gate.staller = None
        await real(period, tries)

    monkeypatch.setattr(coordination, "read_waiting_beats", stall_in_the_yield)
    _beat_through_a_stall(tmp_path, gate, in_the_watchdogs_yield=True)


def _beat_through_a_stall(tmp_path, gate: Gate, in_the_watchdogs_yield: bool) -> None:
    port = _free_port()
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'w.db'}", port=port, use_cp=False,
                        heartbeat_interval_s=INTERVAL, heartbeat_timeout_s=TIMEOUT,
                        register_timeout_s=300.0, log_level="WARNING", access_log=False)
    app = create_app(settings)
    http = guarded_protocol(65536, 100, 10.0, 30.0, quick=HeadBeats(app, None))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, http=http, lifespan="on",
                                           log_level="warning", timeout_keep_alive=60))
    loop = uvloop.new_event_loop()
    thread = threading.Thread(target=loop.run_until_complete, args=(server.serve(),), daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    try:
        _until(lambda: server.started, 60, "the server to start")
        stall_server = asyncio.run_coroutine_threadsafe(
            loop.create_server(lambda: Stall(gate), "127.0.0.1", 0), loop).result(10)
        stall_port = stall_server.sockets[0].getsockname()[1]
        with httpx.Client(base_url=url, timeout=30) as admin:
            job = admin.post("/v1/jobs", json=_job()).json()["id"]
            assert admin.get(f"/v1/jobs/{job}/workers/0/0/assignment",
                             params={"wait_s": 60}).json()["generation"] == 1
            beat = f"/v1/jobs/{job}/workers/0/0/heartbeat"
            assert admin.post(beat, json={"pid": 1}).status_code == 200  # registers (no token set)
            request = (f"POST {beat} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
                       "Content-Length: 0\r\n\r\n").encode()
            # No collection of this long-lived test process's heap inside the timed window (it
            # holds the GIL for the server's thread too); the watchdog is what is tested.
            collecting = gc.isenabled()
            gc.collect()
            gc.disable()
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=30) as worker, \
                        socket.create_connection(("127.0.0.1", stall_port), timeout=30) as staller:
                    worker.sendall(request)
                    assert b" 200 " in _response(worker)  # the last beat read before the stall
                    read_at = time.monotonic()  # after the server read it: the silence is longer
                    gate.until = read_at + SILENCE
                    time.sleep(STALL_AFTER)
                    if in_the_watchdogs_yield:
                        gate.staller = staller
                        gate.armed.set()  # the watchdog's next tick writes it, within a period
                    else:
                        staller.sendall(b"stall")
                    assert gate.started.wait(30), "the loop never read the stalling connection"
                    worker.sendall(request)  # sits unread in the server's socket buffer
                    gate.beat_written.set()
                    answer = _response(worker)  # read once the loop is back
                    time.sleep(0.5)  # two watchdog ticks after the loop came back
            finally:
                gate.beat_written.set()  # a failure above must not leave the loop stalled for 30 s
                if collecting:
                    gc.enable()
            lasted = gate.ended - gate.began
            assert lasted < INTERVAL, f"the stall lasted {lasted:.2f} s: excused, nothing tested"
            assert gate.ended - read_at > TIMEOUT  # the loop came back after the silence outlasted it
            assert b" 200 " in answer and b'"excluded":false' in answer.replace(b" ", b""), answer
            state = admin.get(f"/v1/jobs/{job}/membership").json()
            assert [0, 0] not in state["failed"] and state["generation"] == 1, state
            asyncio.run_coroutine_threadsafe(_close(stall_server), loop).result(10)
    finally:
        server.should_exit = True
        thread.join(30)


def _response(sock: socket.socket) -> bytes:
    """One whole HTTP/1.1 response (head and a Content-Length body) from a blocking socket."""
    data = b""
    while b"\r\n\r\n" not in data:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-response: {data!r}"
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    length = next(int(line.split(b":", 1)[1]) for line in head.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, f"connection closed mid-body: {data!r}"
        body += chunk
    return head + b"\r\n\r\n" + body


async def _close(srv) -> None:
    srv.close()
    await srv.wait_closed()


def _job() -> dict:
    return {"pipelines": 2, "stages": 2, "microbatches": 4, "forward_ms": 10.0, "backward_input_ms": 10.0,
            "backward_weight_ms": 10.0, "p2p_ms": 0.5, "allreduce_ms": 20.0, "optimizer_ms": 2.0,
            "activation_mb": 1.0}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _until(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)
