"""Credentials: the admin token (RECYCLE_API_TOKEN) and per-job worker tokens derived from it.

A worker token is `rw1.<job id>.<HMAC-SHA256(admin token, job id)>`: minted when the job is created
(returned once in the create answer, and to the admin on `GET /v1/jobs/{id}`), checked by
recomputing it, so nothing secret is stored and rotating the admin token revokes every worker
token. It allows only its own job's coordinator routes. Registration ids (`X-Recycle-Registration`)
bind a worker's registration to the process that made it; only their SHA-256 is stored.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass, field

PREFIX = "rw1."
REGISTRATION_HEADER = "X-Recycle-Registration"


def worker_token(secret: str, job_id: str) -> str:
    mac = hmac.new(secret.encode(), f"recycle-worker:{job_id}".encode(), hashlib.sha256).hexdigest()
    return f"{PREFIX}{job_id}.{mac}"


def worker_token_job(secret: str, given: str) -> str | None:
    """The job a well-formed, genuine worker token belongs to; None for anything else."""
    if not given.startswith(PREFIX) or given.count(".") != 2:
        return None
    job_id = given.split(".")[1]
    if not job_id or len(job_id) > 64:
        return None
    return job_id if hmac.compare_digest(given.encode(), worker_token(secret, job_id).encode()) else None


def is_admin(given: str, secret: str) -> bool:
    # Constant-time comparison: the time taken says nothing about how much of the token matched.
    return hmac.compare_digest(given.encode(), secret.encode())


def bearer(authorization: str | None) -> str:
    """The credentials of an `Authorization: Bearer ...` header ("" for anything else)."""
    scheme, _, given = (authorization or "").partition(" ")
    return given if scheme.lower() == "bearer" and given else ""


def admit(secret: str | None, given: str, job_id: str, registration: str | None) -> Caller | None:
    """Who may use a coordinator route of `job_id` with the bearer credentials `given`: the admin
    (or anyone, without a token configured), or the job's own worker token; None: refused (the
    caller says why: 401 for no valid token, 403 for another job's)."""
    if secret is None or is_admin(given, secret):
        return Caller(admin=True, registration=registration)
    if worker_token_job(secret, given) == job_id:
        return Caller(admin=False, job_id=job_id, registration=registration)
    return None


def new_registration() -> tuple[str, str]:
    """A registration id for a worker process and the hash the service keeps of it."""
    session = secrets.token_urlsafe(24)
    return session, registration_hash(session)


def registration_hash(session: str) -> str:
    return hashlib.sha256(session.encode()).hexdigest()


@dataclass(frozen=True, slots=True)
class Caller:
    """Who is calling a coordinator route: the admin (or anyone, without a token configured), or a
    worker token of `job_id`, with the registration id it sent, if any."""

    admin: bool
    job_id: str | None = None
    registration: str | None = None
    registration_sha: str | None = field(default=None, compare=False, repr=False)
    """`registration_hash(registration)` when already computed (a caller reused for a keep-alive
    connection's beats: `api.fastpath.worker_caller`)."""

    def owns(self, stored_hash: str | None) -> bool:
        """Whether this caller made the registration whose hash is stored."""
        if self.admin or stored_hash is None:
            return True
        if self.registration is None:
            return False
        digest = self.registration_sha or registration_hash(self.registration)
        return hmac.compare_digest(digest, stored_hash)
