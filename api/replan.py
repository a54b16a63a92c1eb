"""The plan each generation waits for: the coordinator's side of planning (a mixin of
`api.coordination.Coordinator`, which owns the locks, the store and the long-polls).

A failure set whose plan is stored (precomputed, or solved before) runs that plan. Otherwise the
generation first gets a quick plan (`api.quick_plan`, solved by the solver's quick process, which no
CP-SAT solve ever occupies), so workers hold a valid assignment within about a second however busy
the main solve pool is; the full solve of the same set (heuristic grid, then CP-SAT) runs meanwhile in
the main pool at IMPROVE priority: behind any re-plan whose workers hold no assignment, ahead of every
client solve. When it is done and clearly better (`Membership.improve`, `ADOPT_MARGIN`), and the
generation is still the one it was asked for (compare-and-swap, in memory and in the store), it
becomes generation G+1 with the same failure set. A quick plan that fails falls back to the full
solve, promoted to URGENT.
"""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

from api import logs
from api.materials import is_quick
from api.problems import Problem
from api.solve_queue import IMPROVE, URGENT
from planner.spec import SpecError

if TYPE_CHECKING:
    from api.coordination import Live

log = logs.get("coordinator")


class Replanning:
    """Mixin: expects `plans`, `_settle`, `_commit`, `_settled` and `persist` from the coordinator."""

    async def _request_plan(self, live: Live) -> None:
        """Ask for the plan of `live.m`'s new failure set; the generation is settled now if a plan is
        stored, else when the quick (or, failing that, the full) plan is solved."""
        m = live.m
        try:
            plan, future = await self.plans.request(live.job, list(m.failed), IMPROVE if m.failed else URGENT)
        except SpecError as exc:
            m.no_plan(str(exc))
            return
        if future is None:
            if plan.status != "failed" or not m.failed:
                m.plan_ready(plan.id, plan.status, plan.summary, plan.error)
                return
            # The full solve of this set failed before (a planner error, its deadline): the quick
            # plan's few candidates may still give workers a valid plan rather than stop the job.
            future = asyncio.get_running_loop().create_future()
            future.set_result(plan.status)
        generation = m.generation
        if not m.failed:  # generation 1: the full solve is the fault-free plan, no search to skip
            self._wait_for(live, plan.id, future)
            return
        quick, quick_future = await self.plans.request_quick(live.job, list(m.failed))
        if quick.status == "failed":  # a stored quick failure: only the full solve is left
            self.plans.solver.queue.promote(future, URGENT)
            self._wait_for(live, plan.id, future)
            return
        if quick_future is None:
            m.plan_ready(quick.id, quick.status, quick.summary, quick.error)
        else:
            self._wait_for(live, quick.id, quick_future, fallback=(plan.id, future))
        asyncio.ensure_future(self._when_improved(live, generation, quick.id, plan.id, future))

    def _wait_for(self, live: Live, plan_id: str, future: asyncio.Future,
                  fallback: tuple[str, asyncio.Future] | None = None) -> None:
        """The current generation waits (status pending) for plan `plan_id`, solving in `future`."""
        live.m.plan_ready(plan_id, "pending", None, None)
        asyncio.ensure_future(self._when_solved(live, live.m.generation, plan_id, future, fallback))

    async def _run(self, live: Live, plan) -> None:
        """The current generation runs the solved `plan`: stored, then its long-polls answered."""
        m = live.m
        m.plan_ready(plan.id, plan.status, plan.summary, plan.error)
        await self.persist.save(live.job.id, m)
        log.info("generation ready", extra={"job_id": live.job.id, "generation": m.generation,
                                            "status": m.status,
                                            "plan": "quick" if is_quick(plan.class_key) else "full"})
        self._settled(live)

    async def _when_solved(self, live: Live, generation: int, plan_id: str, future: asyncio.Future,
                           fallback: tuple[str, asyncio.Future] | None = None) -> None:
        """Settle `generation` with plan `plan_id` once solved; a quick plan that failed hands over to
        its `fallback` (the full solve's plan id and future)."""
        await asyncio.shield(future)
        m = live.m
        async with live.lock:
            if live.deleted or m.generation != generation or m.plan_id != plan_id:
                return  # the membership moved on while this plan was solving
            plan = await self.plans.get(live.job, plan_id)
            if plan.status == "pending":  # solve aborted; retry rather than leave workers waiting
                await self._settle(live, m.failed, m.reason)
                return
            if plan.status == "failed" and fallback is not None:
                full_id, full_future = fallback
                log.error("quick plan failed; waiting for the full solve",
                          extra={"job_id": live.job.id, "generation": generation, "error": plan.error})
                self.plans.solver.queue.promote(full_future, URGENT)
                self._wait_for(live, full_id, full_future)
                return
            await self._run(live, plan)

    async def _when_improved(self, live: Live, generation: int, quick_id: str, full_id: str,
                             future: asyncio.Future) -> None:
        """The full solve of `generation`'s failure set is done: run it if it is worth it."""
        await asyncio.shield(future)
        m = live.m
        async with live.lock:
            if live.deleted or m.generation != generation:
                return  # a newer failure set (or an improvement already) made this moot
            plan = await self.plans.get(live.job, full_id)
            if plan.status != "done" or plan.summary is None:
                return  # the full solve failed or was aborted: the quick plan stays
            if m.status == "solving" and m.plan_id == quick_id:
                # The full solve finished before the quick one: this generation runs it directly.
                await self._run(live, plan)
                return
            before, quick_ms = m.generation, m.iteration_ms
            if m.plan_id != quick_id or not m.improve(generation, plan.id, plan.summary, time.monotonic()):
                log.info("full plan kept in reserve", extra={
                    "job_id": live.job.id, "generation": generation, "quick_ms": quick_ms,
                    "full_ms": plan.summary.get("objective_ms")})
                return
            try:
                await self._commit(live, before, needs_plan=False)
            except Problem:  # GenerationConflict, already logged and the job dropped from memory
                return
            log.info("generation improved", extra={"job_id": live.job.id, "generation": m.generation,
                                                   "quick_ms": quick_ms, "full_ms": m.iteration_ms})

    async def _resume_plan(self, live: Live) -> bool:
        """A job loaded running a stored plan keeps it (its workers may be running it: re-deciding
        the plan within the same generation would leave them on the old one). A quick plan still
        gets its improvement. False: the stored plan is not usable, re-plan."""
        m = live.m
        if m.status != "running" or m.plan_id is None:
            return False
        plan = await self.plans.get(live.job, m.plan_id)
        if plan.status != "done":
            return False
        m.plan_ready(plan.id, plan.status, plan.summary, plan.error)
        if is_quick(plan.class_key):
            full, future = await self.plans.request(live.job, list(m.failed), IMPROVE)
            done: asyncio.Future = asyncio.get_running_loop().create_future()
            done.set_result(full.status)
            asyncio.ensure_future(self._when_improved(live, m.generation, plan.id, full.id,
                                                      future if future is not None else done))
        return True
