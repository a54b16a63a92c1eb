"""Heartbeat connections served by a second event loop on a thread of its own.

At 4,096 daemons the service's one event loop has to write 4,095 long-poll answers (29.5 MB) and
take 4,095 re-polls after a failure while 4,096 beats a second keep arriving; whatever else the
loop runs in that iteration, a beat waits for it (whole-run beat p99 0.4-1.2 s measured, the bar
is 100 ms; docs/benchmarks.md). A beat needs no framework: `api.fastpath.HeadBeats` answers it
from its head, in memory. So a keep-alive connection that has carried one head-answered beat is
handed to this loop: the main loop's transport lets go of the socket (a duplicate descriptor keeps
the TCP connection open) and this loop serves it from then on. The main thread holds the GIL while
it works, but a thread waiting for it gets it within the interpreter's switch interval (5 ms), so
a beat no longer waits for the main loop's iteration.

Only a bodiless, keep-alive HTTP/1.1 request that `quick` answers is served here. Anything else on
an adopted connection - another route, a body, `Connection: close`, a head over the limits, a
parse error, a worker the coordinator does not know in memory - is handed back to the main loop
with the bytes received since the last answer, where uvicorn's protocol parses and answers it
as if the connection had never left (and keeps it: a connection is adopted once). A partial head
not complete in `header_timeout_s` gets the main protocol's 408; an idle connection is closed
after the keep-alive timeout, as uvicorn does.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Callable

import httptools

from api import logs
from api.protocol import detach, problem_response, quick_response, serve_descriptor

log = logs.get("beats")
TICK_S = 0.1

Quick = Callable[[bytes, bytes, list, dict], "bytes | None"]
HandBack = Callable[[int, bytes], None]
"""`(descriptor, bytes received but not answered)`: called on the beat thread; must only schedule
work on the main loop (`call_soon_threadsafe`)."""


class BeatLoop:
    """The beat thread's event loop and the connections it serves."""

    def __init__(self, quick: Quick, keep_alive_s: float, header_timeout_s: float,
                 max_header_bytes: int, max_headers: int):
        self.quick = quick
        self.server_state = None
        """uvicorn's server state (its default headers go into every answer), given to `start`."""
        self.keep_alive_s, self.header_timeout_s = keep_alive_s, header_timeout_s
        self.max_header_bytes, self.max_headers = max_header_bytes, max_headers
        self.loop: asyncio.AbstractEventLoop | None = None
        self.thread: threading.Thread | None = None
        self.connections: set[_BeatConnection] = set()
        self.adopted = self.answered = self.handed_back = 0
        """Counts since start (written by the beat thread only)."""
        self.late_max_ms = 0.0
        self.late_over_20ms = self.late_over_100ms = 0
        """How late this loop's own 100 ms tick ran (since start): a beat arriving then waited as
        long - for the GIL, for a core, for a collection - before this thread could read it."""

    def start(self, server_state) -> None:
        self.server_state = server_state
        ready = threading.Event()
        self.thread = threading.Thread(target=self._run, args=(ready,), name="recycle-beats", daemon=True)
        self.thread.start()
        if not ready.wait(10):
            raise RuntimeError("the heartbeat thread did not start within 10 s")

    def _run(self, ready: threading.Event) -> None:
        try:
            import uvloop
            self.loop = uvloop.new_event_loop()
        except ImportError:  # pragma: no cover - uvloop is a dependency; asyncio serves as well
            self.loop = asyncio.new_event_loop()
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._tick, time.monotonic())
        ready.set()
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def _tick(self, due: float) -> None:
        late_ms = max(0.0, time.monotonic() - due) * 1000
        if late_ms > 20:
            self.late_over_20ms += 1
            if late_ms > 100:
                self.late_over_100ms += 1
            self.late_max_ms = max(self.late_max_ms, late_ms)
        self.loop.call_later(TICK_S, self._tick, time.monotonic() + TICK_S)

    def adopt(self, fd: int, memo: dict, hand_back: HandBack) -> None:
        """Serve the connection on descriptor `fd` (ours to close) from now on; any thread."""
        loop = self.loop
        if loop is None or loop.is_closed():
            os.close(fd)  # not serving (stopping): the client sees a closed connection and reconnects
            return
        try:
            loop.call_soon_threadsafe(self._adopt, fd, memo, hand_back)
        except RuntimeError:  # closed between the check and the call
            os.close(fd)

    def _adopt(self, fd: int, memo: dict, hand_back: HandBack) -> None:
        if serve_descriptor(self.loop, fd, lambda: _BeatConnection(self, memo, hand_back)):
            self.adopted += 1

    def stop(self, timeout_s: float = 5.0) -> None:
        """Close every adopted connection and end the thread (from any other thread)."""
        loop, thread = self.loop, self.thread
        if loop is None or thread is None or not thread.is_alive():
            return

        def close_all() -> None:
            for connection in list(self.connections):
                connection.transport.close()
            loop.call_soon(loop.stop)  # after the closes have run

        loop.call_soon_threadsafe(close_all)
        thread.join(timeout_s)
        if thread.is_alive():
            log.warning("heartbeat thread still running after stop", extra={"timeout_s": timeout_s})


class _BeatConnection(asyncio.Protocol):
    """One adopted keep-alive connection: head-answered beats, or hand it back."""

    def __init__(self, beats: BeatLoop, memo: dict, hand_back: HandBack):
        self.beats, self.memo, self.hand_back = beats, memo, hand_back
        self.transport: asyncio.Transport | None = None
        self.buffer = b""
        self.gone = False
        self.timer: asyncio.TimerHandle | None = None
        self.timer_callback: Callable[[], None] | None = None
        self.parser = httptools.HttpRequestParser(self)
        self._reset_request()

    # asyncio.Protocol
    def connection_made(self, transport) -> None:  # type: ignore[override]
        self.transport = transport
        self.beats.connections.add(self)
        self._arm(self.beats.keep_alive_s, self._idle)

    def connection_lost(self, exc: Exception | None) -> None:
        self.beats.connections.discard(self)
        self._disarm()

    def data_received(self, data: bytes) -> None:
        if self.gone:
            return
        self.buffer += data
        self._serve()

    # httptools callbacks
    def on_url(self, url: bytes) -> None:
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name.lower(), value))

    def on_message_begin(self) -> None:
        self.begun += 1

    def on_message_complete(self) -> None:
        self.complete = True

    def _reset_request(self) -> None:
        self.url, self.headers, self.complete, self.begun = b"", [], False, 0

    # Serving
    def _serve(self) -> None:
        beats = self.beats
        while self.buffer:
            end = self.buffer.find(b"\r\n\r\n")
            size = len(self.buffer) if end < 0 else end + 4
            if size > beats.max_header_bytes or self.buffer.count(b"\n", 0, size) > beats.max_headers + 2:
                return self._give_back()  # the main protocol answers 431
            if end < 0:
                if b"\n\n" in self.buffer or b"\n\r\n" in self.buffer:
                    return self._give_back()  # a head ended by bare line feeds: the parser there decides
                if self.timer_callback != self._head_timed_out:  # timed from the head's first byte
                    self._arm(beats.header_timeout_s, self._head_timed_out)
                return
            answer = self._answer(self.buffer[:size])
            if answer is None:
                return self._give_back()
            self.transport.write(answer)
            beats.answered += 1
            self.buffer = self.buffer[size:]
        self._arm(beats.keep_alive_s, self._idle)

    def _answer(self, head: bytes) -> bytes | None:
        """The whole response to the request whose head is `head`; None: not one for this loop."""
        self._reset_request()
        try:
            self.parser.feed_data(head)
        except (httptools.HttpParserError, httptools.HttpParserUpgrade):
            return None
        if not self.complete or self.begun != 1 or self.parser.get_http_version() != "1.1" \
                or not self.parser.should_keep_alive():
            return None  # a body follows, or the connection is to close: uvicorn does both
        if any(name == b"expect" for name, _ in self.headers):
            return None
        try:
            body = self.beats.quick(self.parser.get_method(), self.url, self.headers, self.memo)
        except Exception:  # noqa: BLE001 - the app answers the same request and maps the error
            log.exception("heartbeat thread: quick answer failed; the main loop answers it")
            return None
        if body is None:
            return None
        return quick_response(self.beats.server_state, body)

    def _give_back(self, waited_s: float = 0.0) -> None:
        """Hand the connection and what it sent since the last answer to the main loop."""
        self.gone = True
        self._disarm()
        transport = self.transport
        if transport.is_closing():
            return
        transport.pause_reading()
        if transport.get_write_buffer_size():  # an answer still going out: closing would drop it
            if waited_s < 5.0:
                self.beats.loop.call_later(0.005, self._give_back, waited_s + 0.005)
            else:
                transport.close()
            return
        fd = detach(transport)
        if fd is None:
            transport.close()  # cannot pass it on: the client reconnects and is answered there
            return
        data, self.buffer = self.buffer, b""
        self.beats.handed_back += 1
        try:
            self.hand_back(fd, data)
        except RuntimeError:  # the main loop is closed (the server is stopping): nobody to answer
            os.close(fd)

    def _head_timed_out(self) -> None:
        self.timer = self.timer_callback = None
        if not self.gone and not self.transport.is_closing():
            self.gone = True
            self.transport.write(problem_response(
                408, f"request head not received within {self.beats.header_timeout_s:g} s "
                "(RECYCLE_HEADER_TIMEOUT_S)"))
            self.transport.close()

    def _idle(self) -> None:
        self.timer = self.timer_callback = None
        if not self.buffer and not self.transport.is_closing():
            self.transport.close()

    def _arm(self, delay_s: float, callback: Callable[[], None]) -> None:
        self._disarm()
        self.timer, self.timer_callback = self.beats.loop.call_later(delay_s, callback), callback

    def _disarm(self) -> None:
        if self.timer is not None:
            self.timer.cancel()
        self.timer = self.timer_callback = None
