"""Dependencies (FastAPI `Annotated` style): the service container, the job in the path, the token."""

from __future__ import annotations

import hmac
from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.coordination import Coordinator
from api.metrics import Metrics
from api.plan_service import PlanService
from api.precompute import Precomputer
from api.problems import Problem
from api.settings import Settings
from api.solver import Solver, in_thread
from api.store import JobRow, Store


@dataclass
class Services:
    settings: Settings
    store: Store
    metrics: Metrics
    solver: Solver
    plans: PlanService
    precomputer: Precomputer
    coordinator: Coordinator
    schema_version: int
    jobs: dict[str, JobRow] = field(default_factory=dict)
    """Jobs are immutable once created: cached by id, dropped on delete."""

    async def job(self, job_id: str) -> JobRow:
        found = self.jobs.get(job_id)
        if found is None:
            found = await in_thread(self.store.get_job, job_id)
            if found is None:
                raise Problem(404, f"no job {job_id}", field="job_id")
            self.jobs[job_id] = found
        return found


def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_job(job_id: Annotated[str, Path(max_length=64)], services: ServicesDep) -> JobRow:
    return await services.job(job_id)


JobDep = Annotated[JobRow, Depends(get_job)]

_bearer = HTTPBearer(auto_error=False, description="RECYCLE_API_TOKEN, when the service sets one.")


def require_token(
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    expected = services.settings.api_token
    if expected is None:
        return
    given = credentials.credentials if credentials is not None else ""
    # Constant-time comparison: the time taken says nothing about how much of the token matched.
    if not hmac.compare_digest(given.encode(), expected.get_secret_value().encode()):
        raise Problem(401, "missing or wrong bearer token (Authorization: Bearer <RECYCLE_API_TOKEN>)",
                      headers={"WWW-Authenticate": "Bearer"})


Authorized = [Depends(require_token)]
