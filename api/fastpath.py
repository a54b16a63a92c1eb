"""The hot requests, answered before FastAPI's routing: cached worker instruction streams and
heartbeats that change nothing stored.

Workers of a large job fetch their streams all at once after every generation change, and every
worker beats every second (4,096 beats/s for a 64 x 64 job); for those, routing, dependency
resolution and response models cost more than the answer. This middleware answers
`GET /v1/jobs/{job}/plans/{plan}/workers/{p}/{s}` from the stream cache, and
`POST /v1/jobs/{job}/workers/{p}/{s}/heartbeat` with no body from a registered worker of a loaded
job (`Coordinator.beat_now`), with the same token rules as the app (`api.tokens.admit`). Anything
else - another route, a body, a first beat, a refused or unusual credential, a miss - goes to the
app, which answers it in full (and says why it refuses).
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

from api.tokens import admit, bearer

_STREAM_PATH = re.compile(r"^/v1/jobs/([^/]{1,64})/plans/([^/]{1,64})/workers/(\d{1,9})/(\d{1,9})$")
_BEAT_PATH = re.compile(r"^/v1/jobs/([^/]{1,64})/workers/(\d{1,9})/(\d{1,9})/heartbeat$")
_JSON = (b"content-type", b"application/json")


@dataclass(frozen=True)
class _Route:
    path: str


_STREAM_ROUTE = _Route("/v1/jobs/{job_id}/plans/{plan_id}/workers/{pipeline}/{stage}")
_BEAT_ROUTE = _Route("/v1/jobs/{job_id}/workers/{pipeline}/{stage}/heartbeat")


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

    def _beat(self, scope: Scope, services) -> bytes | None:
        match = _BEAT_PATH.match(scope["path"])
        if match is None:
            return None
        authorization = registration = None
        for name, value in scope["headers"]:
            if name == b"content-length":
                if value.strip() != b"0":
                    return None  # a body (address, pid) may need writing: the app reads it
            elif name == b"transfer-encoding":
                return None
            elif name == b"authorization":
                authorization = value.decode("latin-1")
            elif name == b"x-recycle-registration":
                registration = value.decode("latin-1")
                if len(registration) > 128:
                    return None  # the app refuses it (422)
        job_id, p, s = match.groups()
        caller = admit(self.token, bearer(authorization), job_id, registration)
        if caller is None:
            return None
        data = services.coordinator.beat_now(job_id, (int(p), int(s)), caller)
        if data is not None:
            scope["route"] = _BEAT_ROUTE
        return data
