"""The OpenAPI document as the service really answers: every error is `application/problem+json`,
and the statuses that any route may answer (from the middleware and the token check, not from the
route's own code) are listed on every route. Schemathesis's full checks hold it to that
(tests/api/test_schemathesis.py).

Not listed: 408 and 431, answered by the HTTP protocol layer (api/protocol.py) before any route is
known, and 405 for a method a path does not have (answered with `Allow`).
"""

from __future__ import annotations

from typing import Any

from fastapi import FastAPI

from api.problems import PROBLEM_MEDIA_TYPE
from planner.spec import _NON_NEGATIVE_FIELDS, _POSITIVE_FIELDS

_PROBLEM = {"schema": {"$ref": "#/components/schemas/ProblemDocument"}}
_EVERY_ROUTE = {
    "413": "The request body is over RECYCLE_MAX_BODY_BYTES (by Content-Length, or as it streams).",
    "500": "An unexpected error; the keep-alive connection stays open.",
}
_WITH_TOKEN = {
    "401": "Missing or wrong bearer token (only when the service runs with RECYCLE_API_TOKEN).",
    "403": "A worker token outside its own job's coordinator routes, or a worker not of this job.",
}
_WITH_BODY = {"400": "The body is not well-formed JSON."}


def _problem_responses(operation: dict[str, Any]) -> None:
    responses = operation.setdefault("responses", {})
    extra = dict(_EVERY_ROUTE)
    if operation.get("security"):
        extra.update(_WITH_TOKEN)
    if "requestBody" in operation:
        extra.update(_WITH_BODY)
    for status, description in extra.items():
        responses.setdefault(status, {"description": description})
    for status, response in responses.items():
        if not status.isdigit() or int(status) < 400:
            continue
        content = response.setdefault("content", {})
        content.pop("application/json", None)
        content[PROBLEM_MEDIA_TYPE] = _PROBLEM


def _per_stage_bounds(job_spec: dict[str, Any]) -> None:
    """The spec's per-stage numbers: positive (F, B, W) or non-negative, also inside lists. What
    JSON Schema cannot say (a list has `stages` entries, activation_w_mb <= activation_mb, the
    memory limit holds one micro-batch, the job's op count is within RECYCLE_MAX_PLAN_OPS) is in
    the field descriptions and answered 422 naming the field."""
    for name, prop in job_spec.get("properties", {}).items():
        if name in _POSITIVE_FIELDS:
            bound = {"exclusiveMinimum": 0}
        elif name in _NON_NEGATIVE_FIELDS or name == "memory_limit_mb":
            bound = {"minimum": 0}
        else:
            continue
        for variant in prop.get("anyOf", [prop]):
            if variant.get("type") == "number":
                variant.update(bound)
            elif variant.get("type") == "array":
                variant["items"].update(bound)
                variant.update(minItems=1, maxItems=4096)


def _same_items(node: Any) -> None:
    """`prefixItems` of identical entries (a worker [pipeline, stage]) as the equivalent `items`:
    schemathesis reads response schemas in an older draft that has no `prefixItems`."""
    if isinstance(node, dict):
        prefix = node.get("prefixItems")
        if prefix and all(p == prefix[0] for p in prefix) and node.get("minItems") == node.get(
                "maxItems") == len(prefix):
            node["items"] = node.pop("prefixItems")[0]
        for value in node.values():
            _same_items(value)
    elif isinstance(node, list):
        for value in node:
            _same_items(value)


def install(app: FastAPI) -> None:
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is None:
            schema = generate()
            for path in schema.get("paths", {}).values():
                for operation in path.values():
                    _problem_responses(operation)
            _per_stage_bounds(schema["components"]["schemas"]["JobSpec"])
            _same_items(schema)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
