"""Dependencies (FastAPI `Annotated` style): the service container, the job in the path, the token."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated

from fastapi import Depends, Header, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from api.coordination import Coordinator
from api.lru import LRU
from api.metrics import Metrics
from api.plan_service import PlanService
from api.precompute import Precomputer
from api.problems import Problem
from api.settings import Settings
from api.solver import Solver, in_thread
from api.store import JobRow, Store
from api.tokens import REGISTRATION_HEADER, Caller, admit, is_admin, worker_token_job


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
    jobs: LRU[str, JobRow] = field(default_factory=lambda: LRU(4096))  # bound set by create_app
    """Jobs are immutable once created: cached by id (bounded, least recently used go), dropped on delete."""
    deletes: int = 0
    """Bumped by every job delete: a read that started before one does not cache what it read."""

    async def job(self, job_id: str) -> JobRow:
        found = self.jobs.get(job_id)
        if found is None:
            deletes = self.deletes
            found = await in_thread(self.store.get_job, job_id)
            if found is None:
                raise Problem(404, f"no job {job_id}", field="job_id")
            # A delete that ran while we read may have removed the row after we saw it: caching it
            # now would bring the job back for every later request.
            if self.deletes == deletes:
                self.jobs.put(job_id, found)
        return found

    def remember_job(self, row: JobRow) -> None:
        self.jobs.put(row.id, row)

    async def delete_job(self, job_id: str) -> bool:
        """Database row first, then every in-memory trace, then the job's running work."""
        self.deletes += 1
        try:
            deleted = await in_thread(self.store.delete_job, job_id)
        finally:
            self.deletes += 1
            self.jobs.pop(job_id, None)
            self.coordinator.forget_job(job_id)
            self.plans.forget_job(job_id)
            self.precomputer.forget_job(job_id)
            self.solver.forget_job(job_id)
        return deleted


def get_services(request: Request) -> Services:
    return request.app.state.services


ServicesDep = Annotated[Services, Depends(get_services)]


async def get_job(job_id: Annotated[str, Path(max_length=64)], services: ServicesDep) -> JobRow:
    return await services.job(job_id)


JobDep = Annotated[JobRow, Depends(get_job)]

_bearer = HTTPBearer(auto_error=False, description="RECYCLE_API_TOKEN, when the service sets one.")


def _given(credentials: HTTPAuthorizationCredentials | None) -> str:
    return credentials.credentials if credentials is not None else ""


def _unauthorized() -> Problem:
    return Problem(401, "missing or wrong bearer token (Authorization: Bearer <RECYCLE_API_TOKEN>, or the "
                   "job's worker token on its coordinator routes)", headers={"WWW-Authenticate": "Bearer"})


def require_token(
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
) -> None:
    """Admin routes (jobs, plans, precompute, metrics): the admin token only."""
    expected = services.settings.api_token
    if expected is None:
        return
    given = _given(credentials)
    if is_admin(given, expected.get_secret_value()):
        return
    if worker_token_job(expected.get_secret_value(), given) is not None:
        raise Problem(403, "a worker token allows only its own job's coordinator routes (heartbeat, "
                      "assignment, failures, rejoins, membership, rendezvous); this route needs "
                      "RECYCLE_API_TOKEN")
    raise _unauthorized()


def get_caller(
    job_id: Annotated[str, Path(max_length=64)],
    services: ServicesDep,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
    registration: Annotated[str | None, Header(alias=REGISTRATION_HEADER, max_length=128,
                                               description="The id this worker's registration answered.")]
    = None,
) -> Caller:
    """Coordinator routes: the admin token, or the worker token of the job in the path."""
    secret = services.settings.api_token.get_secret_value() if services.settings.api_token else None
    caller = admit(secret, _given(credentials), job_id, registration)
    if caller is not None:
        return caller
    owner = worker_token_job(secret or "", _given(credentials))
    if owner is None:
        raise _unauthorized()
    raise Problem(403, f"this worker token belongs to job {owner}, not {job_id}", field="job_id")


Authorized = [Depends(require_token)]
CallerDep = Annotated[Caller, Depends(get_caller)]
