"""Issue 9: a worker failure nobody precomputed gets its new assignment while the one solve process is
busy with another job's long CP-SAT solves (before: the re-plan waited for the running solve, up to
its time limit, then solved for up to its own; 13.5 s and 30.5 s under benchmarks/api_abuse.py).
Now the generation first runs a quick plan from the quick process; the full solve follows at IMPROVE
priority, ahead of every queued client solve, and replaces the quick plan when clearly better.
Asserted on order and on which plan was handed out, never on wall time; every wait is bounded.

And the solve queue itself: re-plans of any job before client solves, and within one priority the
job served least recently first, so one job's stream of re-plans cannot starve another's first."""

from __future__ import annotations

import asyncio

from api_testkit import Server, create_job, small_job, wait_for

from api.membership import ADOPT_MARGIN
from api.solve_queue import CLIENT, IMPROVE, URGENT, SolveQueue

BUSY_JOB = small_job(4, 8, 32)  # CP-SAT runs to its time limit on these failure sets (not provable)
FAILING_JOB = small_job(4, 4, 8)


def test_a_failure_gets_a_quick_plan_while_client_solves_hold_the_solver(tmp_path):
    server = Server(f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "server.log", RECYCLE_SOLVER_PROCESSES="1",
                    RECYCLE_USE_CP="true", RECYCLE_SOLVE_TIME_LIMIT_S="10", RECYCLE_HEARTBEAT_TIMEOUT_S="300")
    server.start()
    try:
        with server.client() as c:
            failing = create_job(c, FAILING_JOB)
            assert c.post(f"/v1/jobs/{failing}/workers/0/0/heartbeat").status_code == 200
            first = c.get(f"/v1/jobs/{failing}/workers/0/0/assignment", params={"after": 0, "wait_s": 60})
            assert first.status_code == 200 and first.json()["status"] == "running", first.text
            busy = create_job(c, BUSY_JOB)
            asked = [c.post(f"/v1/jobs/{busy}/plans", json={"failed": [w], "wait_s": 0})
                     for w in ([1, 3], [2, 5], [3, 6])]
            assert [r.status_code for r in asked] == [202, 202, 202], [r.text for r in asked]

            report = c.post(f"/v1/jobs/{failing}/failures", json={"worker": [2, 1]})
            assert report.status_code == 200 and report.json()["generation"] == 2, report.text
            a = c.get(f"/v1/jobs/{failing}/workers/0/0/assignment", params={"after": 1, "wait_s": 60})
            assert a.status_code == 200 and a.json()["status"] == "running", a.text
            quick = a.json()
            assert a.json()["generation"] == 2
            plan = c.get(f"/v1/jobs/{failing}/plans/{quick['plan_id']}").json()
            assert plan["failure_class"].startswith("quick ") and plan["failed"] == [[2, 1]], plan
            # Handed out while the first client solve still holds the solver: none of them is done.
            states = [c.get(r.headers["Location"]).json()["status"] for r in asked]
            assert states == ["pending"] * 3, states

            # The full solve of [2, 1] runs next, ahead of the two queued client solves: done by the
            # time the second is (asked only then: a client's request would itself promote it).
            wait_for(lambda: c.get(asked[1].headers["Location"]).json()["status"] == "done", 100,
                     "the second client solve")
            full = c.post(f"/v1/jobs/{failing}/plans", json={"failed": [[2, 1]], "wait_s": 0})
            assert full.status_code == 200 and full.json()["status"] == "done", full.text
            full = full.json()
            # ... and replaces the quick plan as generation 3, same failure set, when it is better by
            # the margin (CP-SAT found 367.75 ms here where the quick plan has 377.75 ms; a loaded
            # machine may give it less within its limit, so the test follows what it found).
            if full["iteration_ms"] < quick["iteration_ms"] * (1 - ADOPT_MARGIN):
                better = c.get(f"/v1/jobs/{failing}/workers/0/0/assignment",
                               params={"after": 2, "wait_s": 60}, timeout=90)
                assert better.status_code == 200, better.text
                improved = better.json()
                assert (improved["generation"], improved["failed"]) == (3, [[2, 1]])
                assert improved["plan_id"] == full["id"]
            else:
                c.get(f"/v1/jobs/{failing}/workers/0/0/assignment", params={"after": 2, "wait_s": 2})
                assert c.get(f"/v1/jobs/{failing}/membership").json()["generation"] == 2
    finally:
        server.stop()


def test_re_plans_of_any_job_go_first_and_the_least_recently_served_job_first_within_a_priority():
    async def scenario() -> list[str]:
        queue = SolveQueue(1, 100)
        order: list[str] = []

        async def solve(name: str, priority: int, job: str) -> None:
            await queue.acquire(priority, object(), job)
            order.append(name)
            await asyncio.sleep(0)
            queue.release()

        await queue.acquire(URGENT, object(), "busy")  # a busy job's re-plan holds the only slot
        waiting = [asyncio.ensure_future(solve(n, p, j)) for n, p, j in (
            ("client", CLIENT, "other"), ("busy-2", URGENT, "busy"), ("busy-3", URGENT, "busy"),
            ("improve", IMPROVE, "third"), ("first", URGENT, "new"))]
        await asyncio.sleep(0)
        queue.release()
        await asyncio.wait_for(asyncio.gather(*waiting), 10)
        return order

    # "new" (never served) goes before the busy job's queued re-plans; then the busy job's; the
    # improvement before the client solve, though the client asked first.
    assert asyncio.run(scenario()) == ["first", "busy-2", "busy-3", "improve", "client"]
