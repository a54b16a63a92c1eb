"""Issue 9, finding 9: a solve that raises is marked failed with a readable message (not left
pending and resubmitted on every GET), a broken solve pool is replaced, and a solve's total wall time
is bounded (RECYCLE_SOLVE_DEADLINE_S)."""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import os
import signal
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from api_testkit import Server, create_job, metric, small_job

# Runs in a spawned pool process before any solve: the planner raises what a planner bug raises.
PLANNER_BUG = """
import planner.solve
def _bug(*args, **kwargs):
    from planner.validate import PlanInvalid
    raise PlanInvalid(["F of [0, 1] starts before its input arrives", "[1, 0] runs two ops at once"])
planner.solve.plan = _bug
"""
OUT_OF_MEMORY = """
import planner.solve
def _oom(*args, **kwargs):
    raise MemoryError("cannot allocate the CP model")
planner.solve.plan = _oom
"""


def spawn_pool(init_code: str) -> ProcessPoolExecutor:
    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"), initializer=exec,
                               initargs=(init_code,))


def test_planner_errors_cross_the_pool_readably():
    from api import solve_worker

    job = json.dumps(small_job(2, 2, 4))
    with spawn_pool(PLANNER_BUG) as pool:
        try:
            pool.submit(solve_worker.solve_class, job, [], 1.0, False, 0).result(timeout=120)
        except Exception as exc:  # noqa: BLE001 - whatever came back over the pipe
            message = str(exc)
        else:
            raise AssertionError("the patched planner did not raise")
    assert message == ("PlanInvalid: invalid plan: F of [0, 1] starts before its input arrives; "
                       "[1, 0] runs two ops at once"), message


def test_an_unexpected_solve_error_marks_the_plan_failed_once(tmp_path: Path):
    """In process, with the real Solver and store: the class ends `failed` with the error's text, and
    asking again does not start another solve."""
    from api.db import make_engine, migrate
    from api.metrics import Metrics
    from api.settings import Settings
    from api.solver import Solver
    from api.store import Store
    from planner.spec import JobSpec

    engine = make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    migrate(engine)
    store = Store(engine)
    spec = JobSpec.parse(small_job(2, 2, 4))
    row = store.create_job(spec)
    store.ensure_solve(row.id, "none")
    metrics = Metrics()

    async def scenario() -> list[str]:
        settings = Settings(database_url="sqlite://", solve_time_limit_s=1, use_cp=False)
        solver = Solver(settings, store, metrics)
        # The failure-free class is solved by the quick process (api/solver.py): patch that pool.
        solver._quick_pool = spawn_pool(OUT_OF_MEMORY)
        try:
            first = await asyncio.wait_for(solver.ensure(row.id, spec, "none", ()), 120)
            status = store.solve_status(row.id, "none")
            return [first, status]
        finally:
            solver.shutdown()

    outcome = asyncio.run(scenario())
    engine.dispose()
    assert outcome == ["failed", "failed"], outcome
    with make_engine(f"sqlite:///{tmp_path / 'r.db'}").connect() as conn:
        from sqlalchemy import text
        error = conn.execute(text("SELECT error FROM solves")).scalar_one()
    assert error == "MemoryError: cannot allocate the CP model", error


def pool_processes(server: Server) -> list[int]:
    """The server's spawned solve processes (not multiprocessing's resource tracker)."""
    pid = server.proc.pid
    children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    found = []
    for child in children:
        try:
            cmdline = Path(f"/proc/{child}/cmdline").read_bytes()
        except FileNotFoundError:
            continue
        if b"spawn_main" in cmdline:
            found.append(int(child))
    return found


def test_a_killed_solve_process_is_replaced(tmp_path):
    server = Server(f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "server.log")
    server.start()
    try:
        with server.client() as c:
            job_id = create_job(c, small_job(2, 2, 4))
            first = c.post(f"/v1/jobs/{job_id}/plans", json={"failed": [], "wait_s": 30})
            assert first.json()["status"] == "done", first.text
            victims = pool_processes(server)
            assert victims, "no solve process found"
            for pid in victims:
                os.kill(pid, signal.SIGKILL)
            # The next solve gets a fresh pool instead of staying pending forever.
            deadline = time.monotonic() + 60
            r = c.post(f"/v1/jobs/{job_id}/plans", json={"failed": [[0, 0]], "wait_s": 30})
            while r.json()["status"] == "pending" and time.monotonic() < deadline:
                time.sleep(0.2)
                r = c.get(r.headers["Location"])
            assert r.json()["status"] == "done", r.text
            assert metric(c, "recycle_solve_pool_restarts_total") >= 1
    finally:
        server.stop()


def test_a_solve_over_its_deadline_is_stopped_and_marked_failed(tmp_path):
    """A job big enough that its heuristic alone takes far longer than the 0.3 s deadline."""
    server = Server(f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "server.log",
                    RECYCLE_SOLVE_TIME_LIMIT_S="0.1", RECYCLE_SOLVE_DEADLINE_S="0.3")
    server.start()
    try:
        with server.client() as c:
            big = create_job(c, small_job(8, 16, 512))
            r = c.post(f"/v1/jobs/{big}/plans", json={"failed": [[0, 0]], "wait_s": 60})
            assert r.status_code == 200 and r.json()["status"] == "failed", r.text
            assert "deadline of 0.3 s" in r.json()["error"]
            solves = metric(c, "recycle_solves_total")
            for _ in range(3):  # asking again answers the stored failure; nothing is resubmitted
                again = c.get(r.headers["Content-Location"]).json()
                assert again["status"] == "failed"
            assert metric(c, "recycle_solves_total") == solves
            assert metric(c, "recycle_solve_pool_restarts_total") == 1  # the overrunning process stopped
    finally:
        server.stop()
