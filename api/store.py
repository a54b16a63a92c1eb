"""Repository functions over the schema in `api.db`. Synchronous: the app calls them in threads.

Every write is one short transaction, so a kill -9 at any instant leaves either the old or the new
row, never half of one; finished solves are written in the same transaction as their status.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, and_, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from api.db import idempotency_keys, jobs, memberships, operations, plans, registrations, rendezvous, solves
from planner.spec import JobSpec


def new_id() -> str:
    return uuid.uuid4().hex


KEY_RETENTION_S = 86_400.0
"""How long a deleted job's `Idempotency-Key` stays bound to it (a retry or a late duplicate of its
create within this time is refused with 410 instead of making a second job)."""


class KeyReused(ValueError):
    """An `Idempotency-Key` already used for a different request body (answered as 422)."""


class KeyJobDeleted(LookupError):
    """An `Idempotency-Key` whose job was deleted (answered as 410): the create it names happened."""


class GenerationConflict(RuntimeError):
    """The stored generation is not the one this coordinator changed from: another moved it."""

    def __init__(self, job_id: str, generation: int, stored: int | None):
        super().__init__(f"job {job_id}: generation {generation} not stored, the database holds "
                         f"{stored if stored is not None else 'another new one'} (another coordinator?)")


class JobGone(LookupError):
    """The job was deleted while a request for it was under way (answered as 404)."""

    def __init__(self, job_id: str):
        super().__init__(f"no job {job_id} (it was deleted)")
        self.job_id = job_id


@dataclass(frozen=True, slots=True)
class JobRow:
    id: str
    job: JobSpec
    created_at: float


@dataclass(frozen=True, slots=True)
class PlanRow:
    id: str
    job_id: str
    failed_key: str
    class_key: str
    status: str
    summary: dict[str, Any] | None
    error: str | None


class Store:
    def __init__(self, engine: Engine):
        self.engine = engine

    @contextmanager
    def _write(self) -> Iterator[Connection]:
        """A write transaction (on SQLite it takes the write lock up front: no lock upgrades)."""
        with self.engine.connect() as conn:
            conn.execution_options(immediate=True)
            with conn.begin():
                yield conn

    # ------------------------------------------------------------------------------------ jobs
    def create_job(self, job: JobSpec) -> JobRow:
        return self.create_job_once(job, None)[0]

    def create_job_once(self, job: JobSpec, idempotency_key: str | None) -> tuple[JobRow, bool]:
        """The new job, or with a key already used for the same spec the job it made (True: replayed).

        The key and the job are written in one transaction (a retry racing the first request either
        sees both or waits for the write lock / unique key and then reads them)."""
        spec = json.dumps(job.filled())
        digest = hashlib.sha256(json.dumps(job.filled(), sort_keys=True).encode()).hexdigest()
        for _ in range(3):
            if idempotency_key is not None:
                found = self._keyed_job(idempotency_key, digest)
                if found is not None:
                    return found, True
            row = JobRow(new_id(), job, time.time())
            try:
                with self._write() as conn:
                    conn.execute(insert(jobs).values(
                        id=row.id, spec=spec, pipelines=job.pipelines, stages=job.stages,
                        microbatches=job.microbatches, created_at=row.created_at))
                    if idempotency_key is not None:
                        conn.execute(insert(idempotency_keys).values(
                            key=idempotency_key, job_id=row.id, request_sha256=digest,
                            created_at=row.created_at))
                return row, False
            except IntegrityError:
                if idempotency_key is None:
                    raise
                continue  # a concurrent request with this key won: read its job
        raise RuntimeError(f"Idempotency-Key {idempotency_key!r}: neither stored nor found")

    def _keyed_job(self, key: str, digest: str) -> JobRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(
                select(idempotency_keys.c.request_sha256, idempotency_keys.c.job_id, jobs.c.spec,
                       jobs.c.created_at)
                .outerjoin(jobs, jobs.c.id == idempotency_keys.c.job_id)
                .where(idempotency_keys.c.key == key)).first()
        if r is None:
            return None
        if r.request_sha256 != digest:
            raise KeyReused(f"Idempotency-Key: {key!r} was already used to create job {r.job_id} from a "
                            "different job spec; use a new key for a new job")
        if r.spec is None:
            raise KeyJobDeleted(f"Idempotency-Key: {key!r} created job {r.job_id}, which has since been "
                                "deleted; nothing was created (use a new key to create another job)")
        return JobRow(r.job_id, JobSpec.model_validate_json(r.spec), r.created_at)

    def get_job(self, job_id: str) -> JobRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(select(jobs.c.spec, jobs.c.created_at).where(jobs.c.id == job_id)).first()
        return None if r is None else JobRow(job_id, JobSpec.model_validate_json(r.spec), r.created_at)

    def list_jobs(self, limit: int, offset: int) -> tuple[list[JobRow], int]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(jobs.c.id, jobs.c.spec, jobs.c.created_at)
                                .order_by(jobs.c.created_at, jobs.c.id).limit(limit).offset(offset)).all()
            total = conn.execute(select(func.count()).select_from(jobs)).scalar_one()
        return [JobRow(r.id, JobSpec.model_validate_json(r.spec), r.created_at) for r in rows], total

    def delete_job(self, job_id: str) -> bool:
        """Delete the job and everything planned for it. Its operations stay (no foreign key since
        schema v3): a running one is marked cancelled, so whoever polls it learns why it stopped."""
        with self._write() as conn:
            conn.execute(update(operations).where(
                and_(operations.c.job_id == job_id, operations.c.status == "running"))
                .values(status="cancelled", error="the job was deleted", updated_at=time.time()))
            # Children first: SQLite enforces ON DELETE CASCADE only per connection pragma. The job's
            # Idempotency-Key stays (see KEY_RETENTION_S); keys of jobs deleted long ago go now.
            for table in (registrations, memberships, plans, solves, rendezvous):
                conn.execute(delete(table).where(table.c.job_id == job_id))
            conn.execute(delete(idempotency_keys).where(and_(
                idempotency_keys.c.created_at < time.time() - KEY_RETENTION_S,
                idempotency_keys.c.job_id.not_in(select(jobs.c.id)))))
            return conn.execute(delete(jobs).where(jobs.c.id == job_id)).rowcount > 0

    def set_rendezvous(self, job_id: str, address: str) -> None:
        """Where the job's workers meet (replaces the previous address: a restarted store)."""
        with self._job_write(job_id) as conn:
            conn.execute(delete(rendezvous).where(rendezvous.c.job_id == job_id))
            conn.execute(insert(rendezvous).values(job_id=job_id, address=address, updated_at=time.time()))

    def get_rendezvous(self, job_id: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(select(rendezvous.c.address).where(rendezvous.c.job_id == job_id)).scalar()

    def job_exists(self, job_id: str) -> bool:
        with self.engine.connect() as conn:
            return conn.execute(select(jobs.c.id).where(jobs.c.id == job_id)).first() is not None

    @contextmanager
    def _job_write(self, job_id: str) -> Iterator[Connection]:
        """A write of a job's child rows: the job's foreign key failing means it was deleted."""
        try:
            with self._write() as conn:
                yield conn
        except IntegrityError:
            if not self.job_exists(job_id):
                raise JobGone(job_id) from None
            raise

    # ----------------------------------------------------------------------------- plans/solves
    def get_or_create_plan(self, job_id: str, failed_key: str, class_key: str) -> PlanRow:
        """The plan resource of a concrete failure set, creating it (and its class's solve row)."""
        for _ in range(3):
            found = self._find_plan(job_id, failed_key)
            if found is not None:
                return found
            now = time.time()
            try:
                with self._job_write(job_id) as conn:
                    self._ensure_solve_row(conn, job_id, class_key, now)
                    conn.execute(insert(plans).values(id=new_id(), job_id=job_id, failed_key=failed_key,
                                                      class_key=class_key, created_at=now))
            except IntegrityError:
                continue  # a concurrent request created it first: read theirs
        found = self._find_plan(job_id, failed_key)
        if found is None:
            raise JobGone(job_id) if not self.job_exists(job_id) else RuntimeError(
                f"plan of {failed_key} for job {job_id} neither created nor found")
        return found

    def _ensure_solve_row(self, conn, job_id: str, class_key: str, now: float) -> None:
        exists = conn.execute(select(solves.c.status).where(
            and_(solves.c.job_id == job_id, solves.c.class_key == class_key))).first()
        if exists is None:
            conn.execute(insert(solves).values(job_id=job_id, class_key=class_key, status="pending",
                                               created_at=now))

    def ensure_solve(self, job_id: str, class_key: str) -> str:
        """Create the solve row of a class if missing; its status."""
        for _ in range(3):
            try:
                with self._job_write(job_id) as conn:
                    self._ensure_solve_row(conn, job_id, class_key, time.time())
                break
            except IntegrityError:
                continue
        return self.solve_status(job_id, class_key) or "pending"

    def _plan_query(self):
        return (select(plans.c.id, plans.c.job_id, plans.c.failed_key, plans.c.class_key, solves.c.status,
                       solves.c.summary, solves.c.error)
                .join(solves, and_(solves.c.job_id == plans.c.job_id,
                                   solves.c.class_key == plans.c.class_key)))

    def _find_plan(self, job_id: str, failed_key: str) -> PlanRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(self._plan_query().where(
                and_(plans.c.job_id == job_id, plans.c.failed_key == failed_key))).first()
        return None if r is None else _plan_row(r)

    def get_plan(self, job_id: str, plan_id: str) -> PlanRow | None:
        with self.engine.connect() as conn:
            r = conn.execute(self._plan_query().where(
                and_(plans.c.id == plan_id, plans.c.job_id == job_id))).first()
        return None if r is None else _plan_row(r)

    def solve_status(self, job_id: str, class_key: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(select(solves.c.status).where(
                and_(solves.c.job_id == job_id, solves.c.class_key == class_key))).scalar()

    def canonical_timeline(self, job_id: str, class_key: str) -> str | None:
        with self.engine.connect() as conn:
            return conn.execute(select(solves.c.timeline).where(
                and_(solves.c.job_id == job_id, solves.c.class_key == class_key,
                     solves.c.status == "done"))).scalar()

    def finish_solve(self, job_id: str, class_key: str, summary: dict | None, timeline: str | None,
                     error: str | None) -> None:
        with self._write() as conn:
            conn.execute(update(solves).where(
                and_(solves.c.job_id == job_id, solves.c.class_key == class_key)).values(
                status="failed" if error else "done",
                summary=None if summary is None else json.dumps(summary),
                timeline=timeline, error=error, solved_at=time.time()))

    def done_classes(self, job_id: str) -> set[str]:
        with self.engine.connect() as conn:
            return set(conn.execute(select(solves.c.class_key).where(
                and_(solves.c.job_id == job_id, solves.c.status == "done"))).scalars())

    def pending_solves(self) -> list[tuple[str, str]]:
        with self.engine.connect() as conn:
            return [(r.job_id, r.class_key) for r in conn.execute(
                select(solves.c.job_id, solves.c.class_key).where(solves.c.status == "pending"))]

    # ------------------------------------------------------------------------------- operations
    def create_operation(self, job_id: str, max_failures: int, total: int, done: int) -> dict:
        now = time.time()
        values = dict(id=new_id(), job_id=job_id, kind="precompute", max_failures=max_failures,
                      status="running", total=total, done=done, error=None, created_at=now, updated_at=now)
        with self._write() as conn:
            if conn.execute(select(jobs.c.id).where(jobs.c.id == job_id)).first() is None:
                raise JobGone(job_id)  # no foreign key on operations (they outlive their job)
            conn.execute(insert(operations).values(**values))
        return values

    def get_operation(self, operation_id: str) -> dict | None:
        with self.engine.connect() as conn:
            r = conn.execute(select(operations).where(operations.c.id == operation_id)).first()
        return None if r is None else dict(r._mapping)

    def update_operation(self, operation_id: str, **values: Any) -> dict | None:
        """Update an operation that is still running (a cancelled one keeps its final state)."""
        with self._write() as conn:
            conn.execute(update(operations).where(
                and_(operations.c.id == operation_id, operations.c.status == "running"))
                .values(updated_at=time.time(), **values))
        return self.get_operation(operation_id)

    def running_operations(self) -> list[dict]:
        with self.engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(
                select(operations).where(operations.c.status == "running"))]

    # ------------------------------------------------------------------------------ coordinator
    def load_membership(self, job_id: str) -> dict | None:
        with self.engine.connect() as conn:
            r = conn.execute(select(memberships).where(memberships.c.job_id == job_id)).first()
        if r is None:
            return None
        out = dict(r._mapping)
        out["failed"] = [tuple(w) for w in json.loads(out["failed"])]
        return out

    def save_membership(self, job_id: str, generation: int, failed: list, plan_id: str | None, status: str,
                        reason: str | None, expected: int | None = None) -> None:
        """Store the job's membership; compare-and-swap on the generation: the stored one must be
        `expected` (default: `generation`, an update within it; `generation - 1` for a change), or
        none at all for generation 1. Otherwise another coordinator moved it: `GenerationConflict`."""
        expected = generation if expected is None else expected
        values = dict(generation=generation, failed=json.dumps([list(w) for w in failed]), plan_id=plan_id,
                      status=status, reason=reason, updated_at=time.time())
        try:
            with self._job_write(job_id) as conn:
                changed = conn.execute(update(memberships).where(and_(
                    memberships.c.job_id == job_id, memberships.c.generation == expected))
                    .values(**values)).rowcount
                if changed:
                    return
                stored = conn.execute(select(memberships.c.generation)
                                      .where(memberships.c.job_id == job_id)).scalar()
                if stored is not None or generation != 1:
                    raise GenerationConflict(job_id, generation, stored)
                conn.execute(insert(memberships).values(job_id=job_id, **values))
        except IntegrityError:
            if not self.job_exists(job_id):
                raise JobGone(job_id) from None
            raise GenerationConflict(job_id, generation, None) from None

    def register_worker(self, job_id: str, worker: tuple[int, int], address: str | None,
                        pid: int | None, session_sha256: str | None = None) -> None:
        """Record a worker's registration; a new `session_sha256` binds it to another process."""
        self.register_workers(job_id, [(worker, address, pid, session_sha256)])

    def register_workers(self, job_id: str, rows: list[tuple[tuple[int, int], str | None, int | None,
                                                           str | None]]) -> None:
        """Record registrations (worker, address, pid, session hash or None to keep it) in one
        transaction: thousands of workers registering at once cost one commit, not thousands."""
        now = time.time()
        with self._job_write(job_id) as conn:
            for worker, address, pid, session_sha256 in rows:
                key = and_(registrations.c.job_id == job_id, registrations.c.pipeline == worker[0],
                           registrations.c.stage == worker[1])
                values: dict[str, Any] = dict(address=address, pid=pid, registered_at=now)
                if session_sha256 is not None:
                    values["session_sha256"] = session_sha256
                changed = conn.execute(update(registrations).where(key).values(**values)).rowcount
                if not changed:
                    conn.execute(insert(registrations).values(
                        job_id=job_id, pipeline=worker[0], stage=worker[1], **values))

    def registrations(self, job_id: str) -> dict[tuple[int, int], dict]:
        with self.engine.connect() as conn:
            rows = conn.execute(select(registrations).where(registrations.c.job_id == job_id)).all()
        return {(r.pipeline, r.stage): {"address": r.address, "pid": r.pid, "session": r.session_sha256}
                for r in rows}


def _plan_row(r) -> PlanRow:
    return PlanRow(id=r.id, job_id=r.job_id, failed_key=r.failed_key, class_key=r.class_key, status=r.status,
                   summary=None if r.summary is None else json.loads(r.summary), error=r.error)
