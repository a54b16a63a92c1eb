"""The assignment long-poll on the fast path (`api.fastpath`): which polls it answers itself and
which it leaves to the app, in-process against a stand-in coordinator (no server, no clock)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from api.fastpath import FastPaths, poll_query
from api.membership import Membership

JOB = "j"


class StandInCoordinator:
    """Answers `assignment` from a table; records every call (worker, after, wait_s)."""

    def __init__(self, fail: bool = False):
        self.live = SimpleNamespace(job="job-row", deleted=False, m=Membership(2, 2))
        self.calls: list[tuple] = []
        self.fail = fail

    def loaded(self, job_id: str):
        return self.live if job_id == JOB else None

    async def assignment(self, job, worker, after, wait_s):
        self.calls.append((worker, after, wait_s))
        if self.fail:
            raise RuntimeError("stream store unreachable")
        return b'{"generation":2}' if after < 2 else None  # None: wait_s passed, nothing newer


def get(path: str, query: str, coordinator, token: str | None = None, headers=()) -> tuple[list, list]:
    """One GET through FastPaths: (messages it sent, scopes that reached the app)."""
    reached, sent = [], []

    async def app(scope, receive, send):
        reached.append(scope)

    async def send(message):
        sent.append(message)

    async def receive():
        return {"type": "http.request", "body": b""}

    service_app = SimpleNamespace(state=SimpleNamespace(services=SimpleNamespace(
        coordinator=coordinator, settings=SimpleNamespace(max_wait_s=60.0))))
    scope = {"type": "http", "method": "GET", "path": path, "query_string": query.encode(),
             "headers": list(headers)}
    asyncio.run(FastPaths(app, service_app, token)(scope, receive, send))
    return sent, reached


def poll(query: str, coordinator, worker=(0, 1), **kw):
    return get(f"/v1/jobs/{JOB}/workers/{worker[0]}/{worker[1]}/assignment", query, coordinator, **kw)


def test_a_loaded_jobs_poll_is_answered_without_the_app():
    c = StandInCoordinator()
    sent, reached = poll("after=1&wait_s=20", c)
    assert reached == [] and c.calls == [((0, 1), 1, 20.0)]
    assert sent[0]["status"] == 200 and sent[1]["body"] == b'{"generation":2}'
    assert (b"content-length", b"16") in sent[0]["headers"]
    sent, reached = poll("after=2&wait_s=0.5", c)  # nothing newer within wait_s: 204, no body
    assert reached == [] and [m.get("status") for m in sent] == [204, None] and sent[1]["body"] == b""
    sent, _ = poll("", c)  # the app's defaults: after 0, 30 s
    assert c.calls[-1] == ((0, 1), 0, 30.0)
    poll("wait_s=3000", c)  # capped at the service's max_wait_s, as the app does
    assert c.calls[-1] == ((0, 1), 0, 60.0)


def test_anything_unusual_goes_to_the_app():
    c = StandInCoordinator()
    for query in ("after=x", "after=1&after=2", "wait_s=7200", "wait_s=-1", "after=-2", "after=1&extra=1",
                  "wait_s=1e3", "after=%31"):
        sent, reached = poll(query, c)
        assert sent == [] and len(reached) == 1, query  # the app answers (422 or its own parse)
    assert poll("after=1", c, worker=(2, 0))[1], "a worker outside the job: the app refuses it (403)"
    assert get("/v1/jobs/other/workers/0/0/assignment", "after=1", c)[1], "not loaded: the app loads it"
    c.live.deleted = True
    assert poll("after=1", c)[1]
    assert c.calls == []


def test_the_token_rules_are_the_apps():
    c = StandInCoordinator()
    assert poll("after=1", c, token="admin-secret")[1], "no credentials: the app answers 401"
    wrong = [(b"authorization", b"Bearer nope")]
    assert poll("after=1", c, token="admin-secret", headers=wrong)[1]
    admin = [(b"authorization", b"Bearer admin-secret")]
    sent, reached = poll("after=1", c, token="admin-secret", headers=admin)
    assert reached == [] and sent[0]["status"] == 200


def test_an_error_while_answering_leaves_the_poll_to_the_app():
    c = StandInCoordinator(fail=True)
    sent, reached = poll("after=1&wait_s=5", c)
    assert sent == [] and len(reached) == 1 and c.calls == [((0, 1), 1, 5.0)]


def test_poll_query():
    assert poll_query(b"after=3&wait_s=20") == (3, 20.0)
    assert poll_query(b"wait_s=0&after=-1") == (-1, 0.0)
    assert poll_query(b"after=2147483648") is None  # over the app's le=2**31-1
    assert poll_query(b"after=") is None and poll_query(b"after") is None
