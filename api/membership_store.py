"""The coordinator's persistence: a job's membership row (compare-and-swap on the generation) and its
workers' registrations, read and written in threads; what a restarted service resumes from.

Heartbeats stay in memory (thousands per second); a registration is written only when something a
reader can see changes (a new worker, address, pid or process binding), never once per beat, and
registrations arriving together (a 4,096-worker job starting) share one transaction per job.
"""

from __future__ import annotations

import asyncio

from api.membership import FailureSet, Membership, Timeouts
from api.solver import in_thread
from api.store import JobRow, Store
from planner.spec import Worker

Record = tuple[str | None, int | None, str | None]
"""What the store holds for one registration: address, pid, hash of its registration id."""


class MembershipStore:
    def __init__(self, store: Store):
        self.store = store
        self._pending: dict[str, list[tuple[tuple, asyncio.Future]]] = {}
        self._flusher: asyncio.Task | None = None

    async def load(self, job: JobRow, timeouts: Timeouts, now: float
                   ) -> tuple[Membership, dict[Worker, Record], bool | None]:
        """The job's membership as stored, its registrations, and what to do with its plan: None for
        a job never coordinated (generation 1 must be set up), True when the stored generation's
        plan must be requested again (it was solving, or running: a plan id to check), else False.
        After a restart every registered worker gets a full heartbeat timeout of grace."""
        stored = await in_thread(self.store.load_membership, job.id)
        registered = await in_thread(self.store.registrations, job.id)
        m = Membership(job.job.pipelines, job.job.stages, timeouts, changed_at=now,
                       last_seen={w: now for w in registered},
                       sessions={w: info["session"] for w, info in registered.items()},
                       started_at=now if registered else None)
        records = {w: (info["address"], info["pid"], info["session"]) for w, info in registered.items()}
        if stored is None:
            return m, records, None
        m.generation, m.failed = stored["generation"], FailureSet(stored["failed"])
        m.plan_id, m.status, m.reason = stored["plan_id"], stored["status"], stored["reason"]
        return m, records, m.status == "solving" or (m.status == "running" and m.plan_id is not None)

    async def save(self, job_id: str, m: Membership, expected: int | None = None) -> None:
        """Store the membership; the stored generation must be `expected` (default: the same one,
        an update within it) or `GenerationConflict` (another coordinator moved it)."""
        await in_thread(self.store.save_membership, job_id, m.generation, list(m.failed), m.plan_id,
                        m.status, m.reason, expected)

    async def record(self, job_id: str, worker: Worker, address: str | None, pid: int | None,
                     session_sha256: str | None, records: dict[Worker, Record]) -> None:
        """Write a worker's registration if it differs from what is stored (`records` mirrors it): a
        new process binding (`session_sha256`) replaces the record; otherwise a field not given
        keeps its stored value."""
        old = records.get(worker)
        if session_sha256 is not None or old is None:
            new: Record = (address, pid, session_sha256 if session_sha256 is not None else None)
        else:
            new = (address if address is not None else old[0], pid if pid is not None else old[1], old[2])
        if new == old:
            return
        done = asyncio.get_running_loop().create_future()
        self._pending.setdefault(job_id, []).append(((worker, new[0], new[1], session_sha256), done))
        if self._flusher is None or self._flusher.done():
            self._flusher = asyncio.ensure_future(self._flush())
        await done
        records[worker] = new

    async def _flush(self) -> None:
        """Write what is pending, one transaction per job, until nothing is: registrations that
        arrive during a write go into the next one."""
        while self._pending:
            job_id = next(iter(self._pending))
            batch = self._pending.pop(job_id)
            try:
                await in_thread(self.store.register_workers, job_id, [row for row, _ in batch])
            except Exception as exc:  # e.g. JobGone: every waiter of this job gets it
                for _, done in batch:
                    if not done.done():
                        done.set_exception(exc)
            else:
                for _, done in batch:
                    if not done.done():
                        done.set_result(None)

    async def registrations(self, job_id: str) -> dict[Worker, dict]:
        return await in_thread(self.store.registrations, job_id)
