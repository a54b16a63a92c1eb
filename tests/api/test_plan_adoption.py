"""Issue 9: a failure set nobody precomputed runs a quick plan first; the full solve replaces it as
generation G+1 (same failure set) only when it is better by `ADOPT_MARGIN`, and only while the
generation it was asked for is still the current one - in memory and in the store (compare-and-swap).

The coordinator runs in-process on a real SQLite store; the plan service is a stand-in whose solves
finish when the test says, so the order of events is the test's, not the clock's."""

from __future__ import annotations

import asyncio

import pytest

from api.coordination import Coordinator
from api.db import make_engine, migrate
from api.materials import quick_key
from api.membership import ADOPT_MARGIN, Membership, worth_adopting
from api.metrics import Metrics
from api.settings import Settings
from api.store import PlanRow, Store
from api.tokens import Caller
from api.turns import Turns
from planner.spec import JobSpec

ADMIN = Caller(admin=True)
JOB = JobSpec.model_validate({
    "pipelines": 4, "stages": 4, "microbatches": 8, "forward_ms": 10.0, "backward_input_ms": 10.0,
    "backward_weight_ms": 10.0, "p2p_ms": 0.5, "cross_pipeline_p2p_ms": 0.75, "allreduce_ms": 20.0,
    "optimizer_ms": 2.0, "activation_mb": 1.0})


# ------------------------------------------------------------------------------ the pure decision
def running_quick(ms: float = 100.0) -> Membership:
    m = Membership(2, 2, generation=2, failed=((1, 1),), plan_id="quick-1", status="running",
                   reason="worker [1, 1] missed heartbeats", iteration_ms=ms)
    return m


def test_the_full_plan_is_adopted_only_when_better_by_the_margin():
    assert pytest.approx(0.005) == ADOPT_MARGIN
    assert worth_adopting(100.0, 99.0) and not worth_adopting(100.0, 99.6)
    assert not worth_adopting(100.0, 100.0) and not worth_adopting(None, 90.0)
    m = running_quick()
    assert not m.improve(2, "full-1", {"objective_ms": 99.6}, now=5.0)  # 0.4%: not worth a switch
    assert (m.generation, m.plan_id) == (2, "quick-1")
    assert m.improve(2, "full-1", {"objective_ms": 90.0}, now=5.0)
    assert (m.generation, m.failed, m.plan_id, m.status, m.iteration_ms) == (3, ((1, 1),), "full-1",
                                                                            "running", 90.0)
    assert m.changed_at == 5.0 and "100 -> 90 ms" in m.reason and "missed heartbeats" in m.reason


def test_an_improvement_for_an_older_generation_or_a_settling_one_is_refused():
    m = running_quick()
    assert not m.improve(1, "full-1", {"objective_ms": 50.0}, now=5.0)  # asked for generation 1
    m.status = "solving"
    assert not m.improve(2, "full-1", {"objective_ms": 50.0}, now=5.0)
    assert m.generation == 2


# ------------------------------------------------------------------------- through the coordinator
class FakeSolver:
    def __init__(self) -> None:
        self.promoted: list = []
        self.queue = self

    def promote(self, token, priority) -> None:
        self.promoted.append((token, priority))

    def warm_job(self, job_id, job) -> None:
        pass


class FakePlans:
    """Plan rows per (kind, failure set); each solve finishes when `finish` is called."""

    def __init__(self) -> None:
        self.solver = FakeSolver()
        self.rows: dict[str, PlanRow] = {}
        self.ids: dict[tuple[str, frozenset], str] = {}
        self.futures: dict[str, asyncio.Future] = {}
        self.got: list[str] = []

    def _row(self, kind: str, failed) -> tuple[PlanRow, asyncio.Future | None]:
        key = (kind, frozenset(tuple(w) for w in failed))
        plan_id = self.ids.setdefault(key, f"{kind}-{len(self.ids)}")
        if plan_id not in self.rows:
            fk = ";".join(f"{p}:{s}" for p, s in sorted(key[1])) or "none"
            self.rows[plan_id] = PlanRow(plan_id, "job", quick_key(fk) if kind == "quick" else fk,
                                         quick_key(fk) if kind == "quick" else fk, "pending", None, None)
            self.futures[plan_id] = asyncio.get_running_loop().create_future()
            if not failed:
                self._done(plan_id, 100.0)
        row = self.rows[plan_id]
        return row, None if row.status != "pending" else self.futures[plan_id]

    def _done(self, plan_id: str, ms: float) -> None:
        r = self.rows[plan_id]
        self.rows[plan_id] = PlanRow(r.id, r.job_id, r.failed_key, r.class_key, "done", {"objective_ms": ms},
                                     None)
        self.futures[plan_id].set_result("done")

    def finish(self, kind: str, failed, ms: float) -> str:
        plan_id = self.ids[(kind, frozenset(failed))]
        self._done(plan_id, ms)
        return plan_id

    async def request(self, job, failed, priority):
        return self._row("full", failed)

    async def request_quick(self, job, failed):
        return self._row("quick", failed)

    async def get(self, job, plan_id):
        self.got.append(plan_id)
        return self.rows[plan_id]

    async def streams(self, job, plan):
        return {(p, s): b'{"ops":[]}' for p in range(JOB.pipelines) for s in range(JOB.stages)}


async def until(predicate, what: str, timeout_s: float = 30.0) -> None:
    async def poll() -> None:
        while not predicate():
            await asyncio.sleep(0.005)

    try:
        await asyncio.wait_for(poll(), timeout_s)
    except TimeoutError:
        raise AssertionError(f"timed out waiting for {what}") from None


async def finish_and_decide(plans: FakePlans, failed, ms: float) -> str:
    """Finish a full solve and wait until the coordinator's task waiting on it has decided (ended)."""
    tasks = len(asyncio.all_tasks())  # `until` polls in one more task: one fewer than that is the end
    plan_id = plans.finish("full", failed, ms)
    await until(lambda: len(asyncio.all_tasks()) <= tasks, f"the decision on {plan_id}")
    return plan_id


@pytest.fixture
def setup(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'adopt.db'}")
    migrate(engine)
    store = Store(engine)
    job = store.create_job(JOB)
    plans = FakePlans()
    coordinator = Coordinator(Settings(database_url=f"sqlite:///{tmp_path / 'adopt.db'}"), store, plans,
                              Metrics())
    yield store, job, plans, coordinator
    engine.dispose()


async def quick_running(store, job, plans, coordinator):
    live = await coordinator.live(job)
    assert (live.m.generation, live.m.status) == (1, "running")
    await coordinator.report_failure(job, (1, 1), None, None, ADMIN)
    assert (live.m.generation, live.m.status) == (2, "solving")
    quick_id = plans.finish("quick", {(1, 1)}, 100.0)
    await until(lambda: live.m.status == "running", "the quick plan to settle generation 2")
    assert (live.m.generation, live.m.plan_id) == (2, quick_id)
    return live


def test_a_better_full_plan_becomes_the_next_generation_with_the_same_failure_set(setup):
    store, job, plans, coordinator = setup

    async def scenario():
        live = await quick_running(store, job, plans, coordinator)
        full_id = plans.finish("full", {(1, 1)}, 90.0)
        await until(lambda: live.m.generation == 3, "the improvement's generation")
        assert (live.m.failed, live.m.plan_id, live.m.status) == (((1, 1),), full_id, "running")
        await until(lambda: not live.lock.locked(), "the improvement's store write")
        stored = store.load_membership(job.id)
        assert (stored["generation"], stored["plan_id"], stored["status"]) == (3, full_id, "running")

    asyncio.run(scenario())


def test_a_full_plan_not_better_by_the_margin_is_kept_in_reserve(setup):
    store, job, plans, coordinator = setup

    async def scenario():
        live = await quick_running(store, job, plans, coordinator)
        await finish_and_decide(plans, {(1, 1)}, 100.0 * (1 - ADOPT_MARGIN / 2))
        assert (live.m.generation, live.m.plan_id) == (2, plans.ids[("quick", frozenset({(1, 1)}))])
        assert store.load_membership(job.id)["generation"] == 2

    asyncio.run(scenario())


def test_a_full_plan_for_a_failure_set_that_changed_meanwhile_is_not_adopted(setup):
    store, job, plans, coordinator = setup

    async def scenario():
        live = await quick_running(store, job, plans, coordinator)
        await coordinator.report_failure(job, (2, 1), None, None, ADMIN)  # generation 3 is solving
        assert (live.m.generation, live.m.failed) == (3, ((1, 1), (2, 1)))
        await finish_and_decide(plans, {(1, 1)}, 50.0)  # far better, but for generation 2's set
        assert (live.m.generation, live.m.failed, live.m.status) == (3, ((1, 1), (2, 1)), "solving")
        # Also once generation 3 runs its own (slower) quick plan: a late full plan of generation 2's
        # set arriving now must not replace it (it plans for a worker that is now failed).
        await coordinator.report_failure(job, (3, 2), None, None, ADMIN)  # generation 4
        both = plans.finish("quick", {(1, 1), (2, 1), (3, 2)}, 120.0)
        await until(lambda: live.m.status == "running", "generation 4's quick plan")
        await finish_and_decide(plans, {(1, 1), (2, 1)}, 60.0)  # generation 3's set, finished late
        assert (live.m.generation, live.m.plan_id, live.m.status) == (4, both, "running")
        await until(lambda: not live.lock.locked(), "the store write")
        assert store.load_membership(job.id)["generation"] == 4

    asyncio.run(scenario())


def test_an_improvement_loses_to_a_generation_another_coordinator_stored(setup):
    store, job, plans, coordinator = setup

    async def scenario():
        await quick_running(store, job, plans, coordinator)
        store.save_membership(job.id, 7, [[1, 1]], None, "running", "moved elsewhere", 2)
        await finish_and_decide(plans, {(1, 1)}, 50.0)
        await until(lambda: coordinator.loaded(job.id) is None, "the stale job to leave memory")
        stored = store.load_membership(job.id)
        assert (stored["generation"], stored["plan_id"]) == (7, None)

    asyncio.run(scenario())


def test_a_failed_quick_plan_hands_over_to_the_full_solve_promoted_to_urgent(setup):
    store, job, plans, coordinator = setup

    async def scenario():
        live = await coordinator.live(job)
        await coordinator.report_failure(job, (1, 1), None, None, ADMIN)
        quick_id = plans.ids[("quick", frozenset({(1, 1)}))]
        r = plans.rows[quick_id]
        plans.rows[quick_id] = PlanRow(r.id, r.job_id, r.failed_key, r.class_key, "failed", None, "boom")
        plans.futures[quick_id].set_result("failed")
        full_id = plans.ids[("full", frozenset({(1, 1)}))]
        await until(lambda: live.m.plan_id == full_id, "the hand-over to the full solve")
        assert live.m.status == "solving" and (plans.futures[full_id], 0) in plans.solver.promoted
        plans.finish("full", {(1, 1)}, 90.0)
        await until(lambda: live.m.status == "running", "the full plan to settle generation 2")
        assert (live.m.generation, live.m.plan_id) == (2, full_id)

    asyncio.run(scenario())


def test_a_failure_set_whose_full_solve_failed_still_runs_its_quick_plan(setup):
    store, job, plans, coordinator = setup

    async def scenario():
        live = await coordinator.live(job)
        full, _ = plans._row("full", [(1, 1)])
        plans.rows[full.id] = PlanRow(full.id, full.job_id, full.failed_key, full.class_key, "failed", None,
                                      "SolveFailed: the solve overran its deadline")
        await coordinator.report_failure(job, (1, 1), None, None, ADMIN)
        quick_id = plans.finish("quick", {(1, 1)}, 100.0)
        await until(lambda: live.m.status != "solving", "generation 2 to settle")
        assert (live.m.generation, live.m.status, live.m.plan_id) == (2, "running", quick_id)

    asyncio.run(scenario())


def test_the_polls_a_change_wakes_are_answered_a_slice_per_loop_iteration(setup):
    """After a change every alive worker's poll wakes at once; their answers go out two per loop
    iteration here (`Coordinator.turns`), so the sockets are read between slices (at 4,096 daemons
    all answers went out in one iteration while beats waited)."""
    store, job, plans, coordinator = setup
    coordinator.turns = Turns(2)

    async def scenario():
        await coordinator.live(job)
        iteration, stop, answered = [0], asyncio.Event(), []

        def tick() -> None:  # counts loop iterations
            iteration[0] += 1
            if not stop.is_set():
                asyncio.get_running_loop().call_soon(tick)

        async def poll(worker) -> None:
            body = await coordinator.assignment(job, worker, 1, 30.0)
            assert body is not None and b'"generation":2' in body
            answered.append(iteration[0])

        workers = [(p, s) for p in range(4) for s in range(4) if (p, s) != (1, 1)]
        polls = asyncio.gather(*(poll(w) for w in workers))
        await asyncio.sleep(0.01)  # every poll parked on generation 1
        asyncio.get_running_loop().call_soon(tick)
        await coordinator.report_failure(job, (1, 1), None, None, ADMIN)
        plans.finish("quick", {(1, 1)}, 100.0)
        await asyncio.wait_for(polls, 10)
        stop.set()
        per_iteration: dict[int, int] = {}
        for it in answered:
            per_iteration[it] = per_iteration.get(it, 0) + 1
        assert len(answered) == 15 and max(per_iteration.values()) <= 2, per_iteration

    asyncio.run(scenario())


def test_slicing_the_answers_is_opt_in(setup, tmp_path):
    store, job, plans, coordinator = setup
    assert coordinator.turns is None  # the default: every answer of a wake-up at once
    sliced = Coordinator(Settings(database_url=f"sqlite:///{tmp_path / 'adopt.db'}", slice_answers=True),
                         store, plans, Metrics())
    assert isinstance(sliced.turns, Turns) and sliced.turns.per_turn > 1
