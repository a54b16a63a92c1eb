"""Operations endpoints: /healthz (never needs the token), Prometheus /metrics."""

from __future__ import annotations

from fastapi import APIRouter, Response
from prometheus_client import CONTENT_TYPE_LATEST
from sqlalchemy import text

from api.deps import Authorized, ServicesDep
from api.problems import Problem, ProblemDocument
from api.schemas import Health
from api.solver import in_thread

health_router = APIRouter(tags=["ops"])
metrics_router = APIRouter(tags=["ops"], dependencies=Authorized)


@health_router.get("/healthz", response_model=Health, responses={503: {"model": ProblemDocument}})
async def healthz(services: ServicesDep) -> Health:
    def ping() -> None:
        with services.store.engine.connect() as conn:
            conn.execute(text("SELECT 1"))

    try:
        await in_thread(ping)
    except Exception as exc:
        raise Problem(503, f"database unreachable: {type(exc).__name__}",
                      headers={"Retry-After": "1"}) from None
    return Health(status="ok", database=services.store.engine.dialect.name,
                  schema_version=services.schema_version)


@metrics_router.get("/metrics", response_class=Response,
                    responses={200: {"content": {CONTENT_TYPE_LATEST: {}}}})
async def metrics(services: ServicesDep) -> Response:
    return Response(services.metrics.export(), media_type=CONTENT_TYPE_LATEST)
