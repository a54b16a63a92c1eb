"""Plans of failure sets: ask (200 at once when stored, 202 + Location while solving), summary,
timeline (contract JSON), Chrome trace, Gantt PNG, and one worker's instruction stream."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Annotated, Any

from fastapi import APIRouter, Path, Response
from fastapi.responses import JSONResponse

from api.deps import JobDep, ServicesDep
from api.materials import parse_failed_key
from api.problems import ProblemDocument
from api.schemas import PlanRequest, PlanSummary
from api.solver import in_thread
from api.store import JobRow, PlanRow
from planner.instructions import InstructionStream
from planner.timeline import Timeline

router = APIRouter(prefix="/v1/jobs/{job_id}/plans", tags=["plans"],
                   responses={404: {"model": ProblemDocument}, 409: {"model": ProblemDocument},
                              422: {"model": ProblemDocument}})
PlanId = Annotated[str, Path(max_length=64)]
Index = Annotated[int, Path(ge=0, le=2**31 - 1)]


def summary(job: JobRow, plan: PlanRow) -> PlanSummary:
    base = f"/v1/jobs/{job.id}/plans/{plan.id}"
    s = plan.summary or {}
    links = {"self": base}
    if plan.status == "done":
        links.update(timeline=f"{base}/timeline", chrome_trace=f"{base}/chrome-trace",
                     gantt=f"{base}/gantt.png", workers=f"{base}/workers/{{pipeline}}/{{stage}}")
    return PlanSummary(
        id=plan.id, job_id=job.id,
        failed=list(parse_failed_key(plan.failed_key)),
        failure_class=plan.class_key, status=plan.status,
        iteration_ms=s.get("iteration_ms"), fault_free_iteration_ms=s.get("fault_free_iteration_ms"),
        lower_bound_ms=s.get("lower_bound_ms"), gap=s.get("gap"), solver=plan.summary, error=plan.error,
        links=links)


@router.post("", response_model=PlanSummary,
             responses={202: {"model": PlanSummary, "description": "Still solving: poll `Location`."}})
async def request_plan(body: PlanRequest, job: JobDep, services: ServicesDep) -> Response:
    plan, future = await services.plans.request(job, body.failed)
    deadline = time.monotonic() + min(body.wait_s, services.settings.max_wait_s)
    if future is not None:
        if body.wait_s > 0:
            await asyncio.wait([future], timeout=deadline - time.monotonic())  # never cancels the solve
        plan = await services.plans.get(job, plan.id)
    # A plan asked for ahead of time is ready to serve when the answer says done: its streams are
    # built (within the request's wait; a worker failure then needs no work at all).
    warming = services.plans.warm(job, plan)
    if warming is not None and deadline > time.monotonic():
        await asyncio.wait([warming], timeout=deadline - time.monotonic())
    doc = summary(job, plan).model_dump(mode="json")
    if plan.status == "pending":
        headers = {"Location": doc["links"]["self"], "Retry-After": "1"}
        return JSONResponse(doc, status_code=202, headers=headers)
    return JSONResponse(doc, status_code=200, headers={"Content-Location": doc["links"]["self"]})


@router.get("/{plan_id}", response_model=PlanSummary)
async def get_plan(plan_id: PlanId, job: JobDep, services: ServicesDep) -> PlanSummary:
    return summary(job, await services.plans.get(job, plan_id))


@router.get("/{plan_id}/timeline", response_model=Timeline,
            responses={200: {"description": "The recycle.timeline/v1 document."}})
async def get_timeline(plan_id: PlanId, job: JobDep, services: ServicesDep) -> Response:
    material = await services.plans.material(job, await services.plans.get(job, plan_id))
    return Response(material.timeline_bytes, media_type="application/json")


@router.get("/{plan_id}/chrome-trace", response_model=dict[str, Any])
async def get_chrome_trace(plan_id: PlanId, job: JobDep, services: ServicesDep) -> Response:
    from planner.export.chrome import chrome_trace  # matplotlib-free, but only loaded when asked

    material = await services.plans.material(job, await services.plans.get(job, plan_id))
    body = await in_thread(lambda: json.dumps(chrome_trace(material.doc)).encode())
    return Response(body, media_type="application/json")


@router.get("/{plan_id}/gantt.png", response_class=Response,
            responses={200: {"content": {"image/png": {}}}})
async def get_gantt(plan_id: PlanId, job: JobDep, services: ServicesDep) -> Response:
    from planner.export.gantt import gantt_png  # loads matplotlib: only when a chart is asked for

    material = await services.plans.material(job, await services.plans.get(job, plan_id))
    return Response(await in_thread(gantt_png, material.doc), media_type="image/png")


@router.get("/{plan_id}/workers/{pipeline}/{stage}", response_model=InstructionStream)
async def get_worker_stream(plan_id: PlanId, pipeline: Index, stage: Index, job: JobDep,
                            services: ServicesDep) -> Response:
    plan = await services.plans.get(job, plan_id)
    return Response(await services.plans.stream(job, plan, (pipeline, stage)), media_type="application/json")
