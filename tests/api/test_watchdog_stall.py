"""A live worker whose beat sits unread in the server's socket buffer while the server's own loop
is stalled must not be declared failed (issue 9: "the watchdog can declare workers that a
saturated loop has not read as failed").

The server (the real app, protocol and uvloop, on 127.0.0.1) runs in a thread of this process so
the test can stall its event loop for real: a connection to a second listener on the same loop
whose `data_received` blocks for 1.8 s, i.e. a stall in the loop's I/O phase, as a long request
handler is. With heartbeats every 2.0 s and a timeout of 3.0 s the worker's last beat was read
1.4 s before the stall and its next beat arrives during it: 3.2 s after the last read beat the
loop comes back, with a live worker's beat waiting (the figures are scaled up by 1.5 from these
since CI once failed the 2.0 / 3.0 s version on a loaded box: 3.0 / 4.5 s, beat read 2.0 s before
a 2.8 s stall, 1.5 s of slack for the beater thread). The stall is shorter than one heartbeat
interval, so the watchdog does not take it for a stall of the service (`Membership.excuse`), and
libuv runs due timers before it polls the sockets again: the watchdog judged the silence before
the waiting beat was read, and declared the worker failed."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from api.fastpath import HeadBeats
from api.main import create_app
from api.protocol import guarded_protocol
from api.settings import Settings

uvloop = pytest.importorskip("uvloop")

INTERVAL, TIMEOUT, BEFORE_STALL, STALL = 3.0, 4.5, 2.0, 2.8
# BEFORE_STALL + STALL > TIMEOUT (the silence outlasts the timeout by 0.3 s when the loop comes back),
# STALL < INTERVAL (not excused as a stall of the service), the next beat arrives 1.0 s into the
# stall, and the beater thread has TIMEOUT - INTERVAL = 1.5 s of slack for a loaded CI box.


class Stall(asyncio.Protocol):
    def data_received(self, data: bytes) -> None:
        time.sleep(STALL)  # the loop does nothing else meanwhile: a real stall of the server


def test_a_beat_waiting_unread_through_a_short_stall_is_not_silence(tmp_path):
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
            loop.create_server(Stall, "127.0.0.1", 0), loop).result(10)
        stall_port = stall_server.sockets[0].getsockname()[1]
        with httpx.Client(base_url=url, timeout=30) as admin:
            job = admin.post("/v1/jobs", json=_job()).json()["id"]
            assert admin.get(f"/v1/jobs/{job}/workers/0/0/assignment",
                             params={"wait_s": 60}).json()["generation"] == 1
            beat = f"/v1/jobs/{job}/workers/0/0/heartbeat"
            assert admin.post(beat, json={"pid": 1}).status_code == 200  # registers (no token set)
            answered, stop, errors = [time.monotonic()], threading.Event(), []

            def beating() -> None:  # a daemon: a bodiless beat every interval on one connection
                with httpx.Client(base_url=url, timeout=30) as c:
                    while not stop.is_set():
                        sent = time.monotonic()
                        r = c.post(beat)
                        if r.status_code != 200 or r.json()["excluded"]:
                            errors.append(r.text)
                        answered.append(time.monotonic())
                        stop.wait(max(0.0, INTERVAL - (time.monotonic() - sent)))

            beater = threading.Thread(target=beating, daemon=True)
            # No collection of this long-lived test process's heap inside the timed window (it
            # holds the GIL for the beater and the server alike); the watchdog is what is tested.
            collecting = gc.isenabled()
            gc.collect()
            gc.disable()
            beater.start()
            try:
                time.sleep(2 * INTERVAL)  # steady beats
                seen = len(answered)
                _until(lambda: len(answered) > seen, 10, "a beat answered")
                time.sleep(BEFORE_STALL)  # the next beat is due 0.6 s into the stall
                with socket.create_connection(("127.0.0.1", stall_port), timeout=10) as s:
                    s.sendall(b"stall")
                    time.sleep(STALL + 2 * INTERVAL)  # the stall, then beats read again
            finally:
                stop.set()
                beater.join(10)
                if collecting:
                    gc.enable()
            state = admin.get(f"/v1/jobs/{job}/membership").json()
            assert [0, 0] not in state["failed"] and state["generation"] == 1, state
            assert errors == [], errors
            asyncio.run_coroutine_threadsafe(_close(stall_server), loop).result(10)
    finally:
        server.should_exit = True
        thread.join(30)


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
