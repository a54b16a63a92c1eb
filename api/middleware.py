"""Pure ASGI middleware (cheap on the hot path): request body limit, access log and request metrics."""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api import logs
from api.metrics import Metrics
from api.problems import PROBLEM_MEDIA_TYPE, problem_body

access_log = logs.get("access")
error_log = logs.get("errors")


class BodyLimit:
    """413 problem for a body over `max_bytes`, by Content-Length up front or by counting the stream."""

    def __init__(self, app: ASGIApp, max_bytes: int):
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for name, value in scope.get("headers", ()):
            if name == b"content-length":
                try:
                    too_big = int(value) > self.max_bytes
                except ValueError:
                    return await _send_problem(send, 400, "Content-Length is not a number", scope)
                if too_big:
                    return await _send_problem(send, 413, f"request body of {int(value)} bytes exceeds the "
                                               f"limit of {self.max_bytes} (RECYCLE_MAX_BODY_BYTES)", scope)
        seen = 0
        started = rejected = False

        async def limited_receive() -> Message:
            nonlocal seen, rejected, started
            message = await receive()
            if message["type"] == "http.request" and not rejected:
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    # Answer now and tell the app the client left: whatever it does next is dropped.
                    rejected = True
                    if not started:
                        started = True
                        await _send_problem(send, 413, f"request body exceeds the limit of {self.max_bytes} "
                                            "bytes (RECYCLE_MAX_BODY_BYTES)", scope)
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            nonlocal started
            if rejected:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not rejected:
                raise


async def _send_problem(send: Send, status: int, detail: str, scope: Scope) -> None:
    body = problem_body(status, detail, scope.get("path"))
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                            (b"content-length", str(len(body)).encode()), (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})


class ContainErrors:
    """An unexpected error becomes a logged 500 problem and goes no further: the connection stays open.

    Outermost of the service's middleware; Starlette's own error middleware would re-raise to the
    server, which then drops the keep-alive connection. Only an error after the response started
    (nothing valid can follow) is passed on, and that connection is closed."""

    def __init__(self, app: ASGIApp):
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            error_log.error("unhandled error", exc_info=exc, extra={"path": scope.get("path")})
            if started:
                raise
            body = problem_body(500, f"internal error ({type(exc).__name__}); the service keeps running",
                                scope.get("path"))
            await send({"type": "http.response.start", "status": 500,
                        "headers": [(b"content-type", PROBLEM_MEDIA_TYPE.encode()),
                                    (b"content-length", str(len(body)).encode())]})
            await send({"type": "http.response.body", "body": body})


class AccessMetrics:
    """Counts and times every request by route template; one structured log line each when enabled."""

    def __init__(self, app: ASGIApp, metrics: Metrics, log_requests: bool):
        self.app, self.metrics, self.log_requests = app, metrics, log_requests

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = 500

        async def recording_send(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await self.app(scope, receive, recording_send)
        finally:
            elapsed = time.perf_counter() - started
            route = getattr(scope.get("route"), "path", None) or "unmatched"
            self.metrics.requests.labels(scope["method"], route, str(status)).inc()
            self.metrics.request_seconds.labels(route).observe(elapsed)
            if self.log_requests:
                access_log.info("request", extra={"method": scope["method"], "path": scope["path"],
                                                  "route": route, "status": status,
                                                  "ms": round(elapsed * 1000, 2)})
