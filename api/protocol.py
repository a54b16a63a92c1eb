"""uvicorn's httptools protocol with limits on the request head: bytes, header lines, read time.

httptools buffers a header field whole before any callback sees it and ignores uvicorn's h11 size
limit, so a 150 MB header was read into memory. Here the raw bytes of each request head (request
line plus headers) are counted as they arrive, before the parser sees them: over
`max_header_bytes` or `max_headers` lines the connection gets 431 and is closed. A head not
complete within `header_timeout_s` of its first byte (or of the connection opening) gets 408 and is
closed, so half-open and trickling connections are not held. A body not complete within
`body_timeout_s` of its head gets 408 too (its size is limited by `BodyLimit`).

`quick` (`api.fastpath.HeadBeats`) answers requests that need nothing but their head - a registered
worker's bodiless heartbeat - right when the head is parsed, without an ASGI task or request cycle;
only on a keep-alive HTTP/1.1 connection with no earlier request still being answered (responses
stay in order). Whatever it declines (None) goes to the app as usual.

`beat_loop` (`api.beat_loop.BeatLoop`): a connection that has carried a `quick`-answered request
and is idle afterwards (nothing pending either way) is handed to the heartbeat thread, which serves
its later beats; what that thread cannot answer comes back here with its bytes (`_readopt`) and
stays.
"""

from __future__ import annotations

import asyncio
import functools
import os
import socket

from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

_REASONS = {408: b"Request Timeout", 431: b"Request Header Fields Too Large"}


class GuardedHttpTools(HttpToolsProtocol):
    max_header_bytes = 65536
    max_headers = 100
    header_timeout_s = 10.0
    body_timeout_s = 30.0
    beat_loop = None
    """Optional `api.beat_loop.BeatLoop`: idle connections of head-answered beats move there."""
    quick = None
    """Optional `(method, url, headers, memo) -> bytes | None`: a 200 JSON answer from the head
    alone; `memo` is a dict of this connection's own, kept while it lives (`api.fastpath`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._in_head = True
        self._head_bytes = self._head_lines = 0
        self._tail = b""
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._rejected = False
        self._answered = False
        """The current request was answered from its head (`quick`): the app never sees it."""
        self._memo: dict = {}
        self._adoptable = self.beat_loop is not None
        self._handing_over = False
        self._replay = b""
        """Bytes this connection sent to the heartbeat thread that it could not answer (`_readopt`)."""

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._start_head_timer()
        if self._replay:  # before the transport reads anything newer from the socket
            data, self._replay = self._replay, b""
            self.data_received(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self._stop_head_timer()
        self._stop_body_timer()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._rejected:
            return
        if self._in_head:
            window = self._tail + data
            end = window.find(b"\r\n\r\n")
            part = data if end < 0 else data[:max(0, end + 4 - len(self._tail))]
            self._head_bytes += len(part)
            self._head_lines += part.count(b"\n")
            self._tail = window[-3:]
            if self._head_bytes > self.max_header_bytes:
                return self._reject(431, f"request head over {self.max_header_bytes} bytes "
                                    "(RECYCLE_MAX_HEADER_BYTES)")
            if self._head_lines > self.max_headers + 2:  # request line and the blank line
                return self._reject(431, f"more than {self.max_headers} header fields (RECYCLE_MAX_HEADERS)")
        super().data_received(data)

    # Parser callbacks (called from inside data_received)
    def on_message_begin(self) -> None:
        super().on_message_begin()
        self._in_head = True
        if self._head_timer is None:
            self._start_head_timer()

    def on_headers_complete(self) -> None:
        self._in_head = False
        self._stop_head_timer()
        if self.quick is not None and (self.cycle is None or self.cycle.response_complete) \
                and not self.pipeline and self.parser.should_keep_alive() \
                and self.parser.get_http_version() == "1.1":
            body = self.quick(self.parser.get_method(), self.url, self.headers, self._memo)
            if body is not None:
                self._answered = True
                self.transport.write(quick_response(self.server_state, body))
                return
        self._body_timer = self.loop.call_later(self.body_timeout_s, self._body_timed_out)
        super().on_headers_complete()

    def on_body(self, body: bytes) -> None:
        if not self._answered:  # `quick` answers bodiless requests only; nothing to hand on
            super().on_body(body)

    def on_message_complete(self) -> None:
        self._stop_body_timer()
        if self._answered:  # what uvicorn does when a response completes, less the app's cycle
            self._answered = False
            self.server_state.total_requests += 1
            self._unset_keepalive_if_required()
            self.timeout_keep_alive_task = self.loop.call_later(self.timeout_keep_alive,
                                                                self.timeout_keep_alive_handler)
            if self._adoptable and not self._handing_over:
                self._handing_over = True
                self.loop.call_soon(self._hand_over)  # after the parser has returned
        else:
            super().on_message_complete()
        # Whatever comes next on this connection is the next request's head.
        self._in_head, self._head_bytes, self._head_lines, self._tail = True, 0, 0, b""

    # The heartbeat thread
    def _hand_over(self) -> None:
        """Give this connection to the heartbeat thread if nothing is pending on it; else try again
        after its next head-answered beat."""
        self._handing_over = False
        transport = self.transport
        if transport is None or transport.is_closing() or self._rejected or not self._in_head \
                or self._head_bytes or self.pipeline or transport.get_write_buffer_size() \
                or (self.cycle is not None and not self.cycle.response_complete):
            return
        self._adoptable = False
        if transport.get_extra_info("sslcontext") is not None:
            return  # the thread would read TLS records as plain bytes: this one stays here
        fd = detach(transport)
        if fd is None:
            return
        self._stop_head_timer()
        self._unset_keepalive_if_required()
        self.beat_loop.adopt(fd, self._memo, functools.partial(
            self.loop.call_soon_threadsafe, _readopt, type(self), self.config, self.server_state,
            self.app_state, self.loop))

    # Helpers
    def _start_head_timer(self) -> None:
        self._stop_head_timer()
        self._head_timer = self.loop.call_later(self.header_timeout_s, self._head_timed_out)

    def _stop_head_timer(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _stop_body_timer(self) -> None:
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _body_timed_out(self) -> None:
        self._body_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and self.cycle.response_started:
            self.transport.close()  # the app answered already: nothing valid can follow
            return
        self._reject(408, f"request body not received within {self.body_timeout_s:g} s "
                     "(RECYCLE_BODY_TIMEOUT_S)")

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self._in_head and not self.transport.is_closing():
            if self._head_bytes == 0 and self.cycle is not None and not self.cycle.response_complete:
                return  # a request is being answered (a long-poll); its next head is timed on arrival
            self._reject(408, f"request head not received within {self.header_timeout_s:g} s "
                         "(RECYCLE_HEADER_TIMEOUT_S)")

    def _reject(self, status: int, detail: str) -> None:
        self._rejected = True
        self._stop_head_timer()
        self._stop_body_timer()
        if self.cycle is not None:  # the app (if any) reading this body learns the client is gone
            self.cycle.disconnected = True
            self.cycle.message_event.set()
        self.transport.write(problem_response(status, detail))
        self.transport.close()


_quick_heads: tuple = (None, b"")


def quick_response(server_state, body: bytes) -> bytes:
    """The whole 200 response of a `quick` answer (main loop and heartbeat thread alike)."""
    return b"%scontent-length: %d\r\n\r\n%s" % (quick_head(server_state), len(body), body)


def quick_head(server_state) -> bytes:
    """Status line, the server's default headers and the content type of a `quick` answer, joined
    once per change of the default headers (uvicorn replaces that list when its `date` changes,
    once a second), not per beat. One tuple swapped whole: the heartbeat thread reads it too."""
    global _quick_heads
    defaults = server_state.default_headers
    cached, head = _quick_heads
    if cached is not defaults:
        head = b"".join([b"HTTP/1.1 200 OK\r\n",
                         *(name + b": " + value + b"\r\n" for name, value in defaults),
                         b"content-type: application/json\r\n"])
        _quick_heads = (defaults, head)
    return head


def problem_response(status: int, detail: str) -> bytes:
    """A whole 408 or 431 response that closes the connection, as a problem document."""
    body = ('{"type":"about:blank","title":"' + _REASONS[status].decode() + f'","status":{status},'
            f'"detail":"{detail}"}}').encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/problem+json\r\n"
            b"content-length: %d\r\nconnection: close\r\n\r\n" % (status, _REASONS[status], len(body)) + body)


def detach(transport) -> int | None:
    """Let go of a connection: a duplicate of the transport's socket descriptor (the caller's to
    serve or close), the transport closed over its own descriptor only, so the TCP connection stays
    open. None, and the transport untouched, when it has no socket to give."""
    sock = transport.get_extra_info("socket")
    try:
        fd = os.dup(sock.fileno())
    except (OSError, AttributeError):
        return None
    transport.pause_reading()
    transport.abort()
    return fd


def serve_descriptor(loop: asyncio.AbstractEventLoop, fd: int, protocol_factory) -> bool:
    """Serve the connection on descriptor `fd` (now owned here) with `protocol_factory()` on `loop`,
    from that loop's thread: the other half of `detach`. False (and `fd` closed) if it is no socket."""
    try:
        sock = socket.socket(fileno=fd)
    except OSError:
        os.close(fd)
        return False
    task = loop.create_task(loop.connect_accepted_socket(protocol_factory, sock))
    task.add_done_callback(lambda t: t.cancelled() or t.exception() is None or sock.close())
    return True


def _readopt(cls: type, config, server_state, app_state, loop: asyncio.AbstractEventLoop, fd: int,
             data: bytes) -> None:
    """On the main loop: serve a connection the heartbeat thread handed back, starting with the
    bytes it received and did not answer. It stays here (not adoptable again)."""
    protocol = cls(config=config, server_state=server_state, app_state=app_state, _loop=loop)
    protocol._adoptable = False
    protocol._replay = data
    serve_descriptor(loop, fd, lambda: protocol)


def guarded_protocol(max_header_bytes: int, max_headers: int, header_timeout_s: float,
                     body_timeout_s: float, quick=None, beat_loop=None) -> type:
    return type("GuardedHttpToolsProtocol", (GuardedHttpTools,), {
        "max_header_bytes": max_header_bytes, "max_headers": max_headers,
        "header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s,
        "quick": staticmethod(quick) if quick is not None else None,
        "beat_loop": beat_loop if quick is not None else None})
