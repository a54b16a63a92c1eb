"""The coordinator the executor's worker daemons follow: heartbeat (= register), failure and rejoin
reports, and the long-polled assignment of the next generation."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Body, Path, Query, Response

from api.deps import CallerDep, JobDep, ServicesDep
from api.problems import Problem, ProblemDocument
from api.schemas import Assignment, HeartbeatIn, MembershipDetail, MembershipState, Rendezvous, WorkerReport
from api.solver import in_thread

# 409 on every route: loading a job's membership may meet a generation another coordinator moved.
router = APIRouter(prefix="/v1/jobs/{job_id}", tags=["coordinator"],
                   responses={401: {"model": ProblemDocument}, 403: {"model": ProblemDocument},
                              404: {"model": ProblemDocument}, 409: {"model": ProblemDocument},
                              422: {"model": ProblemDocument}})
Index = Annotated[int, Path(ge=0, le=2**31 - 1)]


@router.post("/workers/{pipeline}/{stage}/heartbeat", response_model=MembershipState,
             responses={409: {"model": ProblemDocument}})
async def heartbeat(pipeline: Index, stage: Index, caller: CallerDep, job: JobDep, services: ServicesDep,
                    body: Annotated[HeartbeatIn | None, Body()] = None) -> Response:
    """Register (first beat) or stay alive. Beat every `heartbeat_interval_s`; a registered worker
    silent for `heartbeat_timeout_s` is declared failed. With a worker token, a registration answers
    `registration`: send it as `X-Recycle-Registration` on every later call; another process beating
    for a live registered worker is refused (409)."""
    body = body or HeartbeatIn()
    answer = await services.coordinator.heartbeat(job, (pipeline, stage), body.address, body.pid, caller)
    return Response(answer, media_type="application/json")


@router.post("/failures", response_model=MembershipState,
             responses={409: {"model": ProblemDocument}})
async def report_failure(report: WorkerReport, caller: CallerDep, job: JobDep, services: ServicesDep) -> dict:
    return await services.coordinator.report_failure(job, report.worker, report.reporter, report.reason,
                                                     caller, report.generation)


@router.post("/rejoins", response_model=MembershipState, responses={409: {"model": ProblemDocument}})
async def report_rejoin(report: WorkerReport, caller: CallerDep, job: JobDep, services: ServicesDep) -> dict:
    return await services.coordinator.report_rejoin(job, report.worker, caller)


@router.get("/membership", response_model=MembershipDetail)
async def membership(job: JobDep, services: ServicesDep) -> dict:
    return await services.coordinator.state(job)


@router.get("/workers/{pipeline}/{stage}/assignment", response_model=Assignment,
            responses={204: {"description": "No newer settled generation within wait_s: poll again."}})
async def assignment(
    pipeline: Index, stage: Index, job: JobDep, services: ServicesDep,
    after: Annotated[int, Query(ge=-1, le=2**31 - 1, description="Last generation this worker holds.")] = 0,
    wait_s: Annotated[float, Query(ge=0, le=3600, description="Long-poll up to this long.")] = 30.0,
) -> Response:
    wait = min(wait_s, services.settings.max_wait_s)
    body = await services.coordinator.assignment(job, (pipeline, stage), after, wait)
    if body is None:
        return Response(status_code=204)
    return Response(body, media_type="application/json")


@router.put("/rendezvous", response_model=Rendezvous)
async def set_rendezvous(body: Rendezvous, caller: CallerDep, job: JobDep, services: ServicesDep) -> dict:
    """Register where the job's workers meet (`recycle rendezvous --service`); a worker started
    without `--store` reads it here. A restarted store registers its new address."""
    await in_thread(services.store.set_rendezvous, job.id, body.address)
    return {"address": body.address}


@router.get("/rendezvous", response_model=Rendezvous)
async def get_rendezvous(caller: CallerDep, job: JobDep, services: ServicesDep) -> dict:
    address = await in_thread(services.store.get_rendezvous, job.id)
    if address is None:
        raise Problem(404, f"job {job.id} has no rendezvous store registered yet (start one with "
                      "`recycle rendezvous --service URL --job JOB`)", field="rendezvous")
    return {"address": address}
