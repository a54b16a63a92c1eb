"""The hot read, served before FastAPI's routing: a cached worker instruction stream.

Workers of a large job fetch their streams all at once after every generation change; once a
stream is cached (bytes), routing, dependency resolution and the response model are pure overhead.
This middleware answers `GET /v1/jobs/{job}/plans/{plan}/workers/{p}/{s}` from the cache when it
can (same bytes, same token check) and hands everything else - and every miss - to the app.
"""

from __future__ import annotations

import hmac
import re
from dataclasses import dataclass

from fastapi import FastAPI
from starlette.types import ASGIApp, Receive, Scope, Send

_STREAM_PATH = re.compile(r"^/v1/jobs/([^/]{1,64})/plans/([^/]{1,64})/workers/(\d{1,9})/(\d{1,9})$")


@dataclass(frozen=True)
class _Route:
    path: str = "/v1/jobs/{job_id}/plans/{plan_id}/workers/{pipeline}/{stage}"


_ROUTE = _Route()


class CachedStreams:
    def __init__(self, app: ASGIApp, service_app: FastAPI, token: str | None):
        self.app, self.service_app = app, service_app
        self.expected = None if token is None else f"Bearer {token}".encode()

    def _authorized(self, scope: Scope) -> bool:
        if self.expected is None:
            return True
        for name, value in scope["headers"]:
            if name == b"authorization":
                return hmac.compare_digest(value, self.expected)
        return False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET":
            match = _STREAM_PATH.match(scope["path"])
            services = getattr(self.service_app.state, "services", None)
            if match and services is not None and self._authorized(scope):
                job_id, plan_id, p, s = match.groups()
                data = services.plans.cache.stream(job_id, plan_id, (int(p), int(s)))
                if data is not None:
                    scope["route"] = _ROUTE  # so the access metrics count it under its route
                    await send({"type": "http.response.start", "status": 200,
                                "headers": [(b"content-type", b"application/json"),
                                            (b"content-length", str(len(data)).encode())]})
                    await send({"type": "http.response.body", "body": data})
                    return
        await self.app(scope, receive, send)
