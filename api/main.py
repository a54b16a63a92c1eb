"""The FastAPI application: `create_app(settings)`; lifespan opens the store and starts the solver,
the coordinator's watchdog and any precompute left running by a previous process."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import APIRouter, Depends, FastAPI
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse

from api import logs, openapi, problems
from api.coordination import Coordinator
from api.db import make_engine, migrate
from api.deps import Authorized, Services, get_caller
from api.fastpath import FastPaths
from api.lru import LRU
from api.materials import parse_failed_key
from api.metrics import Metrics
from api.middleware import AccessMetrics, BodyLimit, ContainErrors
from api.plan_service import PlanService
from api.precompute import Precomputer
from api.routers import coordinator, jobs, operations, ops, plans
from api.settings import Settings
from api.solver import Solver, in_thread
from api.store import Store
from planner.failures import normalize

log = logs.get("service")


def _docs_router(app: FastAPI) -> APIRouter:
    router = APIRouter(dependencies=Authorized, include_in_schema=False)

    @router.get("/openapi.json")
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @router.get("/docs")
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url="/openapi.json", title="recycle plan service")

    return router


def create_app(settings: Settings | None = None) -> FastAPI:
    settings = settings or Settings()
    settings.check()
    logs.configure(settings.log_level)
    metrics = Metrics()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        engine = make_engine(settings.database_url)
        version = await in_thread(migrate, engine)
        store = Store(engine)
        solver = Solver(settings, store, metrics)
        solver.start()
        plan_service = PlanService(store, solver, metrics, settings.cache_entries)
        services = Services(
            settings=settings, store=store, metrics=metrics, solver=solver, plans=plan_service,
            precomputer=Precomputer(store, solver, settings.solver_processes,
                                    settings.max_precompute_classes),
            coordinator=Coordinator(settings, store, plan_service, metrics), schema_version=version,
            jobs=LRU(settings.cache_entries))
        metrics.watch_size("jobs", services.jobs)
        metrics.watch_size("finished_plans", plan_service._finished)
        metrics.watch_size("memberships", services.coordinator._members)
        app.state.services = services
        services.coordinator.start()
        await _resume(services)
        log.info("service started", extra={"database": engine.dialect.name, "schema_version": version,
                                           "auth": settings.api_token is not None})
        try:
            yield
        finally:
            services.precomputer.shutdown()
            services.coordinator.shutdown()
            solver.shutdown()
            engine.dispose()
            log.info("service stopped")

    app = FastAPI(
        title="recycle plan service",
        version="1.0.0",
        description="Plans for pipeline-parallel training under worker failures, precomputation, and the "
        "coordinator that worker daemons follow. Errors are RFC 9457 problem documents.",
        lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None,
        # The service's metrics are Prometheus (`api.metrics`). FastAPI's native OpenTelemetry check
        # runs before every request, the fast paths' included (three provider look-ups in the
        # environment): 15.6 of the 217 s the ASGI stack took in a cProfile of 4,096 daemons.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.metrics = metrics  # `recycle serve` adds the heartbeat thread's figures
    problems.install(app)
    openapi.install(app)
    app.include_router(ops.health_router)
    app.include_router(ops.metrics_router)
    unavailable = {503: {"model": problems.ProblemDocument, "content": {problems.PROBLEM_MEDIA_TYPE: {}},
                         "description": "The database is unreachable (or a queue is full): retry after "
                         "`Retry-After` seconds."}}
    for router in (jobs.router, plans.router, operations.router):
        app.include_router(router, dependencies=Authorized, responses=unavailable)
    # Coordinator routes: the admin token or the job's own worker token (checked before the job).
    app.include_router(coordinator.router, dependencies=[Depends(get_caller)], responses=unavailable)
    app.include_router(_docs_router(app))
    token = settings.api_token.get_secret_value() if settings.api_token is not None else None
    app.add_middleware(FastPaths, service_app=app, token=token)
    app.add_middleware(AccessMetrics, metrics=metrics, log_requests=settings.access_log)
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes)
    app.add_middleware(ContainErrors)  # outermost: see its docstring

    return app


async def _resume(services: Services) -> None:
    """Pick up what a previous process left: pending solves and running precompute operations."""
    pending = await in_thread(services.store.pending_solves)
    jobs_needed = {job_id for job_id, _ in pending}
    ops_running = await in_thread(services.store.running_operations)
    jobs_needed |= {op["job_id"] for op in ops_running}
    rows = {}
    for job_id in jobs_needed:
        try:
            rows[job_id] = await services.job(job_id)
        except problems.Problem:
            continue
    for job_id, class_key in pending:
        if job_id in rows:
            job = rows[job_id].job
            canonical = normalize(job, parse_failed_key(class_key))
            services.solver.ensure(job_id, job, class_key, canonical.failed, refuse=False)  # quick ones too
    await services.precomputer.resume_all(rows)
    if pending or ops_running:
        log.info("resumed", extra={"pending_solves": len(pending), "operations": len(ops_running)})
