"""The service's solve processes share each job's fault-free plan through one directory.

A job's fault-free plan is made once, deterministically, and can take tens of seconds on a large
job; the warm-up makes it in the quick process when the job is created. Without a shared directory
each full-solve process made it again inside its first failure solve, whose deadline (2 x the time
limit + 30 s) it could overrun. With real spawned pools: both pools see the same directory, the
warm-up writes the job's plan there, and a directory the service made for itself goes at shutdown.
"""

from __future__ import annotations

import asyncio
import json
import os
from pathlib import Path

from api_testkit import small_job


def _solver(tmp_path: Path, **settings):
    from api.db import make_engine, migrate
    from api.metrics import Metrics
    from api.settings import Settings
    from api.solver import Solver
    from api.store import Store

    engine = make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    migrate(engine)
    return Solver(Settings(database_url="sqlite://", solve_time_limit_s=1, use_cp=False, **settings),
                  Store(engine), Metrics())


def _caches(solver) -> set:
    from api import solve_worker

    return {pool.submit(solve_worker.fault_free_cache).result(timeout=120)
            for pool in (solver._pool, solver._quick_pool)}


def _warm(solver, job) -> None:
    async def scenario() -> None:
        solver.warm_job("job-1", job)
        await asyncio.wait_for(asyncio.gather(*solver._tasks), 120)

    asyncio.run(scenario())


def test_the_solve_processes_share_one_fault_free_cache_the_service_removes(tmp_path: Path):
    from planner.fault_free import canonical_hash
    from planner.spec import JobSpec

    job = JobSpec.parse(small_job(2, 3, 5))
    solver = _solver(tmp_path, fault_free_cache=None)  # whatever the environment says
    solver.start()
    try:
        caches = _caches(solver)
        assert len(caches) == 1 and None not in caches, caches  # one directory, in both pools
        folder = Path(caches.pop())
        assert folder.is_dir() and not list(folder.iterdir())
        _warm(solver, job)
        written = folder / f"{canonical_hash(job)}.json"
        assert written.is_file()  # a full-solve process reads it instead of solving again
        assert json.loads(written.read_text())["ops"]
    finally:
        solver.shutdown()
    assert not folder.exists()  # the service's own temporary directory


def test_an_empty_fault_free_cache_setting_means_the_services_own(tmp_path: Path):
    """RECYCLE_FAULT_FREE_CACHE= (empty) is "no directory" to the planner; the service must not
    take it for the current directory."""
    solver = _solver(tmp_path, fault_free_cache="")
    solver.start()
    try:
        (folder,) = _caches(solver)
        assert folder and Path(folder).is_dir() and Path(folder).resolve() != Path.cwd().resolve()
    finally:
        solver.shutdown()
    assert not Path(folder).exists()


def test_a_configured_fault_free_cache_is_used_and_kept(tmp_path: Path):
    from planner.fault_free import canonical_hash
    from planner.spec import JobSpec

    folder = tmp_path / "ff-cache"
    folder.mkdir()
    job = JobSpec.parse(small_job(2, 2, 4))
    solver = _solver(tmp_path, fault_free_cache=str(folder))
    solver.start()
    try:
        assert _caches(solver) == {str(folder)}
        _warm(solver, job)
    finally:
        solver.shutdown()
    assert (folder / f"{canonical_hash(job)}.json").is_file()  # kept across restarts


# Runs in a spawned pool process: making any fault-free plan takes 4 s longer than it does.
SLOW_FAULT_FREE = """
import planner.fault_free
planner.fault_free.real_solve = planner.fault_free._solve
def _slow(*args, **kwargs):
    import time
    import planner.fault_free as ff  # exec's names are not this function's globals
    time.sleep(4.0)
    return ff.real_solve(*args, **kwargs)
planner.fault_free._solve = _slow
"""


def test_a_solve_deadline_does_not_count_the_fault_free_plan(tmp_path: Path):
    """A job's fault-free plan is made once, before its first solve, and can take tens of seconds
    (45 s on 8 x 32 x 256): it runs under RECYCLE_FAULT_FREE_DEADLINE_S of its own, so a 3 s solve
    deadline still lets a 1 s solve finish when the fault-free plan takes 4 s; a fault-free plan
    overrunning its own deadline fails the solve with a message that names it."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from api.db import make_engine, migrate
    from api.metrics import Metrics
    from api.settings import Settings
    from api.solver import Solver
    from api.store import Store
    from planner.failures import normalize
    from planner.spec import JobSpec

    def run(fault_free_deadline_s: float) -> tuple[str, str | None]:
        engine = make_engine(f"sqlite:///{tmp_path / f'r{fault_free_deadline_s:g}.db'}")
        migrate(engine)
        store = Store(engine)
        job = JobSpec.parse(small_job(2, 2, 4))
        row = store.create_job(job)
        canonical = normalize(job, [(0, 1)])
        store.ensure_solve(row.id, canonical.key)
        settings = Settings(database_url="sqlite://", solve_time_limit_s=1, solve_deadline_s=3,
                            fault_free_deadline_s=fault_free_deadline_s, use_cp=False, fault_free_cache=None)
        solver = Solver(settings, store, Metrics())
        solver._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"),
                                           initializer=exec, initargs=(SLOW_FAULT_FREE,))
        async def solve() -> str:
            return await asyncio.wait_for(solver.ensure(row.id, job, canonical.key, canonical.failed), 120)

        try:
            status = asyncio.run(solve())
            with engine.connect() as conn:
                from sqlalchemy import text
                error = conn.execute(text("SELECT error FROM solves")).scalar_one()
            return status, error
        finally:
            solver.shutdown()
            engine.dispose()

    assert run(fault_free_deadline_s=60) == ("done", None)
    status, error = run(fault_free_deadline_s=1)
    assert status == "failed" and "fault-free plan overran its deadline of 1 s" in error, error


def test_a_killed_services_temporary_cache_goes_when_the_next_service_starts(tmp_path: Path):
    """SIGKILL skips the shutdown that removes the service's own directory: the next service on the
    machine removes the orphan (its pid no longer runs), and leaves a live service's alone."""
    from api_testkit import Server

    temp = tmp_path / "tmp"
    temp.mkdir()
    live = temp / f"recycle-fault-free-{os.getpid()}-live"  # this test's process runs
    live.mkdir()
    unrelated = temp / "recycle-fault-free-notapid"  # not a pid: nothing to tell, kept
    unrelated.mkdir()
    first = Server(f"sqlite:///{tmp_path / 'a.db'}", tmp_path / "a.log", TMPDIR=str(temp)).start()
    try:
        (own,) = [p for p in temp.iterdir() if p.name.startswith(f"recycle-fault-free-{first.proc.pid}-")]
    finally:
        first.kill9()
    assert own.is_dir()  # nobody removed it: the service was killed
    second = Server(f"sqlite:///{tmp_path / 'b.db'}", tmp_path / "b.log", TMPDIR=str(temp)).start()
    try:
        assert not own.exists()
        assert live.is_dir() and unrelated.is_dir()
        assert [p for p in temp.iterdir() if p.name.startswith(f"recycle-fault-free-{second.proc.pid}-")]
    finally:
        second.stop()
    assert sorted(p.name for p in temp.iterdir()) == sorted([live.name, unrelated.name])


def test_only_caches_whose_service_pid_is_gone_are_removed(tmp_path: Path):
    """The sweep itself: a finished process's pid is gone, this test's own pid runs, a name without
    a pid tells nothing, and other names are not the service's."""
    import subprocess
    import sys

    from api.solver import remove_orphaned_caches

    finished = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                              capture_output=True, text=True, check=True, timeout=60)
    dead_pid = int(finished.stdout)
    names = {"dead": f"recycle-fault-free-{dead_pid}-abc", "live": f"recycle-fault-free-{os.getpid()}-abc",
             "no_pid": "recycle-fault-free-abc", "other": f"something-{dead_pid}-abc"}
    for name in names.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "plan.json").write_text("{}")
    assert remove_orphaned_caches(str(tmp_path)) == [str(tmp_path / names["dead"])]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [names["live"], names["no_pid"], names["other"]])
