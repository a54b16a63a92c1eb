"""The hot requests, answered before FastAPI's routing: cached worker instruction streams,
heartbeats that change nothing stored, and the assignment long-polls of a loaded job.

Workers of a large job fetch their streams all at once after every generation change, and every
worker beats every second (4,096 beats/s for a 64 x 64 job); for those, routing, dependency
resolution and response models cost more than the answer. This middleware answers
`GET /v1/jobs/{job}/plans/{plan}/workers/{p}/{s}` from the stream cache,
`POST /v1/jobs/{job}/workers/{p}/{s}/heartbeat` with no body from a registered worker of a loaded
job (`Coordinator.beat_now`), and `GET /v1/jobs/{job}/workers/{p}/{s}/assignment` of a loaded job
(`Coordinator.assignment`: after a failure every alive worker's poll is answered at once, and each
re-polls at once), with the same token rules as the app (`api.tokens.admit`). Anything else -
another route, a body, a first beat, a query the app would refuse, a refused or unusual
credential, a miss, an error while answering a poll - goes to the app, which answers it in full
(and says why it refuses).
"""

from __future__ import annotations

import hmac
import re
import threading
import time
from bisect import bisect_left
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from api.tokens import Caller, admit, bearer, registration_hash

_STREAM_PATH = re.compile(r"^/v1/jobs/([^/]{1,64})/plans/([^/]{1,64})/workers/(\d{1,9})/(\d{1,9})$")
_BEAT_PATH = re.compile(r"^/v1/jobs/([^/]{1,64})/workers/(\d{1,9})/(\d{1,9})/heartbeat$")
_BEAT_URL = re.compile(rb"^/v1/jobs/([A-Za-z0-9_.~-]{1,64})/workers/(\d{1,9})/(\d{1,9})/heartbeat$")
_POLL_PATH = re.compile(r"^/v1/jobs/([^/]{1,64})/workers/(\d{1,9})/(\d{1,9})/assignment$")
_AFTER = re.compile(rb"^(-1|\d{1,10})$")
_WAIT_S = re.compile(rb"^\d{1,4}(\.\d{1,6})?$")
_MAX_INDEX = 2**31 - 1
_JSON = (b"content-type", b"application/json")


@dataclass(frozen=True)
class _Route:
    path: str


_STREAM_ROUTE = _Route("/v1/jobs/{job_id}/plans/{plan_id}/workers/{pipeline}/{stage}")
_BEAT_ROUTE = _Route("/v1/jobs/{job_id}/workers/{pipeline}/{stage}/heartbeat")
_POLL_ROUTE = _Route("/v1/jobs/{job_id}/workers/{pipeline}/{stage}/assignment")


def poll_query(query: bytes) -> tuple[int, float] | None:
    """`after` and `wait_s` of an assignment poll's query (defaults 0 and 30, as the app's); None
    for anything the app might answer otherwise (out of range, repeated, unknown, encoded)."""
    after, wait_s = 0, 30.0
    seen = set()
    for part in query.split(b"&") if query else ():
        name, _, value = part.partition(b"=")
        if name in seen:
            return None
        seen.add(name)
        if name == b"after" and _AFTER.match(value):
            after = int(value)
        elif name == b"wait_s" and _WAIT_S.match(value):
            wait_s = float(value)
        else:
            return None
    if after > _MAX_INDEX or wait_s > 3600:
        return None
    return after, wait_s


def worker_caller(token: str | None, headers, job_id: str, bodiless: bool = False,
                  memo: dict | None = None) -> Caller | None:
    """The caller of a coordinator route, admitted as the app would; None: let the app decide
    (refused, unusual headers, or - when `bodiless` - a body the app must read).

    `memo`: one keep-alive connection's own dict (`api.protocol`). A worker token's check is an
    HMAC (a quarter of a heartbeat's server time, `benchmarks/beat_path.py`), a pure function of
    the token and the admin secret, which is fixed for the process; so a worker caller admitted on
    this connection is reused for a later request that sends byte-identical `Authorization` and
    `X-Recycle-Registration` values for the same job. Anything else is checked in full. Nothing is
    trusted beyond that: whether the job still exists and the worker's registration is still this
    one is decided per request (`Coordinator.beat_now`), so a deleted job's beats go to the app."""
    authorization = registration = None
    for name, value in headers:
        if name == b"content-length":
            if bodiless and value.strip() != b"0":
                return None  # a body (address, pid) may need writing: the app reads it
        elif name == b"transfer-encoding":
            if bodiless:
                return None
        elif name == b"authorization":
            authorization = value
        elif name == b"x-recycle-registration":
            registration = value
            if len(registration) > 128:
                return None  # the app refuses it (422)
    if memo is not None:
        known = memo.get("caller")
        if known is not None and known[0] == authorization and known[1] == registration \
                and known[2] == job_id:
            return known[3]
    given = bearer(authorization.decode("latin-1") if authorization is not None else None)
    session = registration.decode("latin-1") if registration is not None else None
    caller = admit(token, given, job_id, session)
    if memo is not None and caller is not None and not caller.admin:
        caller = Caller(admin=False, job_id=caller.job_id, registration=session,
                        registration_sha=registration_hash(session) if session is not None else None)
        memo["caller"] = (authorization, registration, job_id, caller)
    return caller


class HeadBeats:
    """Bodiless heartbeats answered from the request head alone, by the HTTP protocol itself
    (`api.protocol`), before an ASGI request exists: no task, no scope, no middleware.

    At 4,096 daemons the service gets 4,096 beats/s on one core; through the ASGI fast path each
    still cost a task, the uvicorn request cycle and five middleware layers (the ASGI stack was
    217 s of a 335 s cProfile at 4,096 daemons; `FastPaths._beat` itself 85 s of it). Same rules
    as `FastPaths._beat`: anything else (a query, percent-encoding, a body, another credential,
    an unknown or unloaded worker) returns None and goes the usual way. Counted in the request
    metrics under the heartbeat route like any other request. Called from the main loop and from
    the heartbeat thread (`api.beat_loop`): the counters are updated under a lock."""

    def __init__(self, service_app: FastAPI, token: str | None):
        self.service_app, self.token = service_app, token
        self._services = None
        self._beats = 0
        self._seconds = 0.0
        self._buckets: list[int] = []
        self._bounds: tuple[float, ...] = ()
        self._lock = threading.Lock()

    def __call__(self, method: bytes, url: bytes, headers: list[tuple[bytes, bytes]],
                 memo: dict | None = None) -> bytes | None:
        if method != b"POST":
            return None
        match = _BEAT_URL.match(url)
        if match is None:
            return None
        services = self._services
        if services is None:  # resolved once (Starlette's `state` is a Python __getattr__ per call)
            services = getattr(self.service_app.state, "services", None)
            if services is None:
                return None
            self._attach(services)
        started = time.perf_counter()
        job_id = match.group(1).decode("ascii")
        caller = worker_caller(self.token, headers, job_id, bodiless=True, memo=memo)
        if caller is None:
            return None
        data = services.coordinator.beat_now(job_id, (int(match.group(2)), int(match.group(3))), caller)
        if data is not None:
            elapsed = time.perf_counter() - started
            bucket = bisect_left(self._bounds, elapsed)
            with self._lock:
                self._beats += 1
                self._seconds += elapsed
                self._buckets[bucket] += 1
        return data

    def _attach(self, services) -> None:
        self._services = services
        self._bounds = services.metrics.latency_bounds
        self._buckets = [0] * (len(self._bounds) + 1)
        services.metrics.before_export(self.flush)

    def flush(self) -> None:
        """Add the beats answered since the last flush to the request metrics (before every
        export): per beat, a labelled counter and a histogram observation took ~7 % of a beat's
        server time; counted here they cost an integer increment and a bisect."""
        if not self._beats or self._services is None:
            return
        with self._lock:
            beats, seconds, buckets = self._beats, self._seconds, self._buckets
            self._beats, self._seconds, self._buckets = 0, 0.0, [0] * len(buckets)
        m = self._services.metrics
        m.requests.labels("POST", _BEAT_ROUTE.path, "200").inc(beats)
        m.add_observations(m.request_seconds.labels(_BEAT_ROUTE.path), buckets, seconds)


class FastPaths:
    def __init__(self, app: ASGIApp, service_app: FastAPI, token: str | None):
        self.app, self.service_app, self.token = app, service_app, token
        self.expected = None if token is None else f"Bearer {token}".encode()

    def _admin(self, scope: Scope) -> bool:
        if self.expected is None:
            return True
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, self.expected)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            services = getattr(self.service_app.state, "services", None)
            data = None
            if services is None:
                pass
            elif scope["method"] == "POST":
                data = self._beat(scope, services)
            elif scope["method"] == "GET":
                data = self._stream(scope, services)
                if data is None and await self._poll(scope, services, send):
                    return
            if data is not None:
                await send({"type": "http.response.start", "status": 200,
                            "headers": [_JSON, (b"content-length", str(len(data)).encode())]})
                await send({"type": "http.response.body", "body": data})
                return
        await self.app(scope, receive, send)

    def _stream(self, scope: Scope, services) -> bytes | None:
        match = _STREAM_PATH.match(scope["path"])
        if match is None or not self._admin(scope):
            return None
        job_id, plan_id, p, s = match.groups()
        data = services.plans.cache.stream(job_id, plan_id, (int(p), int(s)))
        if data is not None:
            scope["route"] = _STREAM_ROUTE  # so the access metrics count it under its route
        return data

    async def _poll(self, scope: Scope, services, send: Send) -> bool:
        """Answer an assignment poll of a loaded job (200 or 204); False: the app answers it."""
        match = _POLL_PATH.match(scope["path"])
        if match is None:
            return False
        query = poll_query(scope["query_string"])
        caller = worker_caller(self.token, scope["headers"], match.group(1))
        if query is None or caller is None:
            return False
        job_id, p, s = match.groups()
        worker = (int(p), int(s))
        coordinator = services.coordinator
        live = coordinator.loaded(job_id)
        if live is None or live.deleted or not live.m.in_job(worker):
            return False  # the app loads the job, or says why it refuses
        after, wait_s = query
        wait_s = min(wait_s, services.settings.max_wait_s)
        try:
            data = await coordinator.assignment(live.job, worker, after, wait_s)
        except Exception:  # noqa: BLE001 - the app answers the same poll and maps the error
            return False
        scope["route"] = _POLL_ROUTE
        if data is None:
            await send({"type": "http.response.start", "status": 204, "headers": []})
            await send({"type": "http.response.body", "body": b""})
        else:
            await send({"type": "http.response.start", "status": 200,
                        "headers": [_JSON, (b"content-length", str(len(data)).encode())]})
            await send({"type": "http.response.body", "body": data})
        return True

    def _beat(self, scope: Scope, services) -> bytes | None:
        match = _BEAT_PATH.match(scope["path"])
        if match is None:
            return None
        job_id, p, s = match.groups()
        caller = worker_caller(self.token, scope["headers"], job_id, bodiless=True)
        if caller is None:
            return None
        data = services.coordinator.beat_now(job_id, (int(p), int(s)), caller)
        if data is not None:
            scope["route"] = _BEAT_ROUTE
        return data
