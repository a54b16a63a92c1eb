"""Jobs: create (a contract job spec), get, list, delete."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Header, Query, Response
from pydantic import SecretStr

from api import logs
from api.deps import JobDep, ServicesDep
from api.problems import Problem, ProblemDocument
from api.schemas import JobList, JobOut
from api.solver import in_thread
from api.store import JobRow
from api.tokens import worker_token
from planner.compress import check_plannable
from planner.spec import JobSpec

router = APIRouter(prefix="/v1/jobs", tags=["jobs"],
                   responses={404: {"model": ProblemDocument}, 422: {"model": ProblemDocument}})
log = logs.get("jobs")


def job_out(row: JobRow, secret: SecretStr | None) -> JobOut:
    token = None if secret is None else worker_token(secret.get_secret_value(), row.id)
    return JobOut(id=row.id, created_at=row.created_at, spec=row.job.filled(),
                  workers=row.job.pipelines * row.job.stages, op_count=row.job.op_count, worker_token=token)


IdempotencyKey = Annotated[str | None, Header(
    alias="Idempotency-Key", min_length=1, max_length=255, pattern=r"^[\x21-\x7e]+$",
    description="Makes a retry safe: the same key with the same spec answers the job the first "
    "request created (`Idempotent-Replayed: true`) instead of creating another; the same key with "
    "another spec is refused (422); once that job is deleted the key stays bound to it for 24 h "
    "(410: a late retry makes no second job).")]


@router.post("", status_code=201, response_model=JobOut,
             responses={410: {"model": ProblemDocument, "description": "The Idempotency-Key's job was "
                              "deleted; nothing was created."}})
async def create_job(spec: JobSpec, services: ServicesDep, response: Response,
                     idempotency_key: IdempotencyKey = None) -> JobOut:
    limit = services.settings.max_plan_ops
    if spec.op_count > limit:
        raise Problem(422, f"microbatches: job too large: 3 x {spec.pipelines} pipelines x {spec.stages} "
                      f"stages x {spec.microbatches} microbatches = {spec.op_count} F/B/W ops per plan, "
                      f"over this service's limit of {limit} (RECYCLE_MAX_PLAN_OPS)", field="microbatches")
    check_plannable(spec)  # SpecError -> 422: a job no plan could be made for is not stored
    row, replayed = await in_thread(services.store.create_job_once, spec, idempotency_key)
    services.remember_job(row)
    response.headers["Location"] = f"/v1/jobs/{row.id}"
    if replayed:
        response.headers["Idempotent-Replayed"] = "true"
        return job_out(row, services.settings.api_token)
    log.info("job created", extra={"job_id": row.id, "pipelines": spec.pipelines, "stages": spec.stages,
                                   "microbatches": spec.microbatches})
    return job_out(row, services.settings.api_token)


@router.get("", response_model=JobList)
async def list_jobs(services: ServicesDep, limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0) -> JobList:
    rows, total = await in_thread(services.store.list_jobs, limit, offset)
    secret = services.settings.api_token
    return JobList(items=[job_out(r, secret) for r in rows], total=total, limit=limit, offset=offset)


@router.get("/{job_id}", response_model=JobOut)
async def get_job(job: JobDep, services: ServicesDep) -> JobOut:
    return job_out(job, services.settings.api_token)


@router.delete("/{job_id}", status_code=204)
async def delete_job(job: JobDep, services: ServicesDep) -> Response:
    await services.delete_job(job.id)
    log.info("job deleted", extra={"job_id": job.id})
    return Response(status_code=204)
