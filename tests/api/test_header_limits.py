"""Issue 9, finding 2: request heads are bounded before they are read whole (bytes and header
lines: 431) and in time (a head not complete in RECYCLE_HEADER_TIMEOUT_S: 408, closed), bodies in
time too (RECYCLE_BODY_TIMEOUT_S), on a real server over raw sockets; ordinary requests are
untouched."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from api_testkit import Server


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("heads")
    srv = Server(f"sqlite:///{tmp / 'r.db'}", tmp / "server.log", RECYCLE_HEADER_TIMEOUT_S="1",
                 RECYCLE_BODY_TIMEOUT_S="1").start()
    try:
        yield srv
    finally:
        srv.stop()


def connect(server: Server) -> socket.socket:
    parts = urlsplit(server.url)
    return socket.create_connection((parts.hostname, parts.port), timeout=20)


def send_all_then_read(sock: socket.socket, chunks) -> bytes:
    """Send until the server stops reading (it may close mid-way), then read what it answered."""
    try:
        for chunk in chunks:
            sock.sendall(chunk)
    except (BrokenPipeError, ConnectionResetError):
        pass
    return read_until_closed(sock)


def read_until_closed(sock: socket.socket) -> bytes:
    got = b""
    try:
        while chunk := sock.recv(65536):  # bounded by the socket's 20 s timeout
            got += chunk
    except ConnectionResetError:
        pass
    return got


def status(response: bytes) -> int:
    assert response.startswith(b"HTTP/1.1 "), response[:200]
    return int(response.split(b" ", 2)[1])


def healthy(server: Server) -> None:
    with connect(server) as s:
        s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        assert status(read_until_closed(s)) == 200


def test_a_huge_header_is_refused_before_it_is_read(server):
    with connect(server) as s:
        head = b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Big: "
        got = send_all_then_read(s, [head, *(b"a" * 65536 for _ in range(64)), b"\r\n\r\n"])  # 4 MiB
    assert status(got) == 431 and b"connection: close" in got.lower(), got[:300]
    healthy(server)


def test_too_many_header_fields_are_refused(server):
    with connect(server) as s:
        fields = b"".join(b"X-F%d: 1\r\n" % i for i in range(500))
        got = send_all_then_read(s, [b"GET /healthz HTTP/1.1\r\nHost: t\r\n" + fields + b"\r\n"])
    assert status(got) == 431, got[:300]
    healthy(server)


@pytest.mark.parametrize("sent", [b"", b"GET /healthz HTTP/1.1\r\nHost: t\r\n"], ids=["silent", "half-head"])
def test_a_head_not_finished_in_time_is_answered_408_and_closed(server, sent):
    with connect(server) as s:
        s.sendall(sent)
        got = read_until_closed(s)  # the server closes it (1 s here); the socket's 20 s bounds the wait
    assert status(got) == 408, got[:300]


def test_a_body_not_finished_in_time_is_answered_408_and_closed(server):
    with connect(server) as s:
        s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                  b"Content-Length: 400\r\n\r\n{\"pipelines\": 2")  # and then nothing
        got = read_until_closed(s)
    assert status(got) == 408 and b"RECYCLE_BODY_TIMEOUT_S" in got, got[:300]
    healthy(server)


def test_ordinary_requests_keep_working_on_one_connection(server):
    with connect(server) as s:
        buffer = b""
        for _ in range(3):
            s.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\nX-Pad: " + b"p" * 8000 + b"\r\n\r\n")
            while b"\r\n\r\n" not in buffer:
                buffer += s.recv(65536)
            head, buffer = buffer.split(b"\r\n\r\n", 1)
            length = int(next(line.split(b":")[1] for line in head.split(b"\r\n")
                              if line.lower().startswith(b"content-length")))
            while len(buffer) < length:
                buffer += s.recv(65536)
            buffer = buffer[length:]
            assert status(head) == 200
