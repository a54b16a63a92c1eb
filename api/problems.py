"""RFC 9457 problem documents (`application/problem+json`) for every error the service returns.

Each document has `type`, `title`, `status`, `detail` and, where one field is to blame, `field`
(dotted path into the request body or the parameter name) plus `errors` with every field's message.
"""

from __future__ import annotations

import json
import re
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from pydantic import BaseModel
from sqlalchemy.exc import InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout
from starlette.exceptions import HTTPException as StarletteHTTPException

from api import logs
from api.solve_queue import QueueFull
from api.store import JobGone, KeyJobDeleted, KeyReused
from planner.spec import SpecError

PROBLEM_MEDIA_TYPE = "application/problem+json"
_TITLES = {400: "Bad request", 401: "Unauthorized", 403: "Forbidden", 404: "Not found",
           405: "Method not allowed", 409: "Conflict", 410: "Gone", 413: "Request too large",
           415: "Unsupported media type",
           422: "Unprocessable request", 500: "Internal error", 501: "Not implemented",
           503: "Service unavailable"}
log = logs.get("errors")


class FieldError(BaseModel):
    field: str | None
    message: str


class ProblemDocument(BaseModel):
    """RFC 9457 problem details."""

    type: str = "about:blank"
    title: str
    status: int
    detail: str
    instance: str | None = None
    field: str | None = None
    errors: list[FieldError] = []


class Problem(Exception):
    """Raise anywhere in a request to answer with a problem document."""

    def __init__(self, status: int, detail: str, field: str | None = None,
                 headers: dict[str, str] | None = None, errors: list[dict] | None = None):
        super().__init__(detail)
        self.status, self.detail, self.field, self.headers = status, detail, field, headers
        if errors is None:
            errors = [{"field": field, "message": detail}] if field else []
        self.errors = errors


def problem_body(status: int, detail: str, instance: str | None = None, field: str | None = None,
                 errors: list[dict] | None = None) -> bytes:
    doc: dict[str, Any] = {"type": "about:blank", "title": _TITLES.get(status, "Error"), "status": status,
                           "detail": detail, "instance": instance, "field": field, "errors": errors or []}
    return json.dumps(doc).encode()


def problem_response(status: int, detail: str, instance: str | None = None, field: str | None = None,
                     errors: list[dict] | None = None, headers: dict[str, str] | None = None) -> Response:
    return Response(problem_body(status, detail, instance, field, errors), status_code=status,
                    media_type=PROBLEM_MEDIA_TYPE, headers=headers)


_TYPE_TAGS = {"float", "int", "str", "bool", "none", "list", "dict", "tuple"}


def _loc_field(loc: tuple | list) -> str | None:
    parts = [str(p) for p in loc]
    if parts and parts[0] in ("body", "query", "path", "header"):
        parts = parts[1:]
    # Drop pydantic's union-member tags ("float", "list[float]", "function-after[...]"): the client
    # named `forward_ms`, not `forward_ms.float`.
    parts = [p for p in parts if not ("[" in p or p in _TYPE_TAGS)]
    return ".".join(parts) or None


def _message_field(msg: str) -> str | None:
    head = msg.split(":", 1)[0]
    return head.split("[", 1)[0] if ":" in msg and head and " " not in head else None


def _documented_methods(app: FastAPI, path: str) -> list[str]:
    """The methods the OpenAPI document gives `path` (Starlette's own `Allow` names only the first
    route of a path, and a path has one route per method)."""
    for template, operations in app.openapi()["paths"].items():
        if re.fullmatch(re.sub(r"\{[^/]+\}", "[^/]+", template), path):
            return sorted(method.upper() for method in operations)
    return []


def install(app: FastAPI) -> None:
    @app.exception_handler(Problem)
    async def _problem(request: Request, exc: Problem) -> Response:
        return problem_response(exc.status, exc.detail, request.url.path, exc.field, exc.errors, exc.headers)

    @app.exception_handler(SpecError)
    async def _spec(request: Request, exc: SpecError) -> Response:
        return problem_response(422, str(exc), request.url.path, exc.field,
                                [{"field": exc.field, "message": str(exc)}])

    @app.exception_handler(QueueFull)
    async def _full(request: Request, exc: QueueFull) -> Response:
        return problem_response(503, str(exc), request.url.path, headers={"Retry-After": "2"})

    @app.exception_handler(JobGone)
    async def _gone(request: Request, exc: JobGone) -> Response:
        return problem_response(404, str(exc), request.url.path, "job_id")

    @app.exception_handler(KeyReused)
    async def _reused(request: Request, exc: KeyReused) -> Response:
        return problem_response(422, str(exc), request.url.path, "Idempotency-Key")

    @app.exception_handler(KeyJobDeleted)
    async def _key_gone(request: Request, exc: KeyJobDeleted) -> Response:
        return problem_response(410, str(exc), request.url.path, "Idempotency-Key")

    async def _database(request: Request, exc: Exception) -> Response:
        """The database is unreachable, locked or out of connections: a temporary condition."""
        log.warning("database unavailable", extra={"path": request.url.path, "error": type(exc).__name__})
        return problem_response(503, "the database is unavailable right now; retry shortly",
                                request.url.path, headers={"Retry-After": "1"})

    for db_error in (OperationalError, InterfaceError, PoolTimeout):
        app.add_exception_handler(db_error, _database)

    @app.exception_handler(RequestValidationError)
    async def _validation(request: Request, exc: RequestValidationError) -> Response:
        errors = []
        for e in exc.errors():
            msg = str(e.get("msg", "invalid")).removeprefix("Value error, ")
            if e.get("type") == "extra_forbidden":
                msg = "unknown field (not part of this request's schema; check its spelling)"
            elif str(e.get("type", "")).endswith(("_type", "_parsing")) and "input" in e:
                msg = f"{msg}, got {repr(e['input'])[:100]} (no conversion from strings or booleans)"
            field = _loc_field(e.get("loc", ())) or _message_field(msg)
            message = f"{field}: {msg}" if field and field not in msg else msg
            if {"field": field, "message": message} not in errors:
                errors.append({"field": field, "message": message})
        for e in exc.errors():
            if e.get("type") == "json_invalid":
                where = e.get("loc", ("body", "?"))[-1]
                why = (e.get("ctx") or {}).get("error", "JSON decode error")
                detail = f"malformed JSON body at character {where}: {why}"
                return problem_response(400, detail, request.url.path, None,
                                        [{"field": None, "message": detail}])
        first = errors[0] if errors else {"field": None, "message": "invalid request"}
        return problem_response(422, first["message"], request.url.path, first["field"], errors)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException) -> Response:
        headers = dict(getattr(exc, "headers", None) or {})
        if exc.status_code == 405:
            headers["Allow"] = ", ".join(_documented_methods(request.app, request.url.path))
        return problem_response(exc.status_code, str(exc.detail), request.url.path, headers=headers)
    # Unexpected errors are answered by `api.middleware.ContainErrors`: a handler for `Exception`
    # here would run in Starlette's ServerErrorMiddleware, which re-raises after answering, and
    # uvicorn then closes the keep-alive connection (a client retrying after the reset may repeat
    # a write).
