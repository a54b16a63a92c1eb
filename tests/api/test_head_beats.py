"""Heartbeats answered by the HTTP protocol from the request head (`api.protocol` with
`api.fastpath.HeadBeats`): no ASGI task is started for them, responses stay in order, and they are
counted in the request metrics like any other request."""

from __future__ import annotations

import asyncio

import httpx
from api_testkit import create_job, metric, small_job
from uvicorn.config import Config
from uvicorn.server import ServerState

from api.protocol import guarded_protocol

BEAT = b"POST /v1/jobs/j/workers/0/1/heartbeat HTTP/1.1\r\nhost: t\r\ncontent-length: 0\r\n\r\n"
POLL = b"GET /v1/jobs/j/workers/0/1/assignment?after=1 HTTP/1.1\r\nhost: t\r\n\r\n"


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written: list[bytes] = []
        self.closed = False

    def write(self, data) -> None:
        self.written.append(bytes(data))

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass


def connection(quick):
    """A protocol instance on a fake transport, as uvicorn makes one per connection."""
    reached: list[dict] = []

    async def app(scope, receive, send):  # a long-poll that never answers within the test
        reached.append(scope)
        await asyncio.Event().wait()

    cls = guarded_protocol(65536, 100, 10.0, 30.0, quick=quick)
    config = Config(app=app, http=cls, lifespan="off")
    config.load()
    state = ServerState()
    protocol = cls(config=config, server_state=state, app_state={})
    transport = Transport()
    protocol.connection_made(transport)
    return protocol, transport, state, reached


def beats_only(method, url, headers, memo):
    return b'{"beat":true}' if method == b"POST" and url.endswith(b"/heartbeat") else None


def test_a_beat_is_answered_from_its_head_without_an_asgi_task():
    async def run():
        protocol, transport, state, reached = connection(beats_only)
        protocol.data_received(BEAT + BEAT)  # two on one keep-alive connection, even in one segment
        assert state.tasks == set() and reached == []
        answer = b"".join(transport.written)
        assert answer.count(b"HTTP/1.1 200 OK\r\n") == 2 and answer.endswith(b'{"beat":true}')
        assert b"content-length: 13\r\n" in answer and state.total_requests == 2
        protocol.connection_lost(None)
    asyncio.run(run())


def test_a_beat_behind_an_unanswered_request_waits_its_turn():
    """A beat pipelined behind a long-poll on the same connection must not overtake its answer."""
    async def run():
        protocol, transport, state, reached = connection(beats_only)
        protocol.data_received(POLL)
        await asyncio.sleep(0)
        assert len(reached) == 1 and len(state.tasks) == 1  # the poll went to the app
        protocol.data_received(BEAT)
        assert transport.written == [] and len(protocol.pipeline) == 1  # queued behind it, unanswered
        for task in list(state.tasks):
            task.cancel()
        protocol.connection_lost(None)
    asyncio.run(run())


def test_what_the_hook_declines_goes_to_the_app():
    async def run():
        protocol, transport, state, reached = connection(lambda method, url, headers, memo: None)
        protocol.data_received(BEAT)
        await asyncio.sleep(0)
        assert len(reached) == 1 and reached[0]["path"] == "/v1/jobs/j/workers/0/1/heartbeat"
        for task in list(state.tasks):
            task.cancel()
        protocol.connection_lost(None)
    asyncio.run(run())


def test_head_beats_of_a_real_server_are_answered_and_counted(server, client):
    job_id = create_job(client, small_job(2, 2, 4))
    path = f"/v1/jobs/{job_id}/workers/1/0/heartbeat"
    assert client.post(path, json={"pid": 7}).status_code == 200  # registers (through the app)
    route = 'route="/v1/jobs/{job_id}/workers/{pipeline}/{stage}/heartbeat"'
    before = metric(client, f'recycle_http_requests_total{{method="POST",{route},status="200"}}')
    timed_before = metric(client, f'recycle_http_request_seconds_count{{{route}}}')
    with httpx.Client(base_url=server.url, timeout=10) as beats:  # one keep-alive connection
        for _ in range(3):
            r = beats.post(path)
            assert r.status_code == 200 and r.headers["content-type"] == "application/json"
            assert r.headers["server"] == "uvicorn" and r.headers["date"].endswith(" GMT")  # as the app's
            body = r.json()
            assert body["worker"] == [1, 0] and body["excluded"] is False and body["generation"] >= 1
    after = metric(client, f'recycle_http_requests_total{{method="POST",{route},status="200"}}')
    assert after - before == 3
    # ... and timed: counted outside the registry per beat, flushed into it before the export
    timed = metric(client, f'recycle_http_request_seconds_count{{{route}}}')
    assert timed - timed_before == 3
