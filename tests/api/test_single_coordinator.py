"""Issue 9, finding 7: one active coordinator per database. A second server on the same database
(SQLite file or PostgreSQL schema) refuses to start with one line naming the holder; once the first
is gone (kill -9 included) a server starts. Generation changes are compare-and-swap in the store."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from api_testkit import REPO, STORES, Server, database_for, free_port, small_job


def second_server(database_url: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "RECYCLE_DATABASE_URL": database_url, "RECYCLE_USE_CP": "false"}
    return subprocess.run([sys.executable, "-m", "cli.main", "serve", "--port", str(free_port())], cwd=REPO,
                          env=env, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("store", STORES)
def test_a_second_server_on_the_same_database_refuses_to_start(store, tmp_path):
    urls = database_for(store, tmp_path)
    url = next(urls)
    first = Server(url, tmp_path / "first.log")
    try:
        first.start()
        with first.client() as c:
            assert c.post("/v1/jobs", json=small_job(2, 2, 4)).status_code == 201
        refused = second_server(url)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert refused.stderr.count("\n") == 1 and "already coordinates" in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr
        with first.client() as c:  # the first one goes on, untouched
            assert c.get("/v1/jobs").json()["total"] == 1
        first.kill9()
        again = Server(url, tmp_path / "again.log").start()  # the dead holder's lock went with it
        try:
            with again.client() as c:
                assert c.get("/v1/jobs").json()["total"] == 1
        finally:
            again.stop()
    finally:
        first.stop()
        for _ in urls:
            pass


def test_generation_changes_are_compare_and_swap(tmp_path):
    from api.db import make_engine, migrate
    from api.store import GenerationConflict, Store
    from planner.spec import JobSpec

    engine = make_engine(f"sqlite:///{tmp_path / 'r.db'}")
    migrate(engine)
    store = Store(engine)
    job = store.create_job(JobSpec.parse(small_job(2, 2, 4)))
    store.save_membership(job.id, 1, [], None, "running", None)
    store.save_membership(job.id, 2, [(0, 0)], None, "running", "a", expected=1)
    # A second coordinator still at generation 1 moves it too: refused, the first one's stays.
    with pytest.raises(GenerationConflict):
        store.save_membership(job.id, 2, [(1, 1)], None, "running", "b", expected=1)
    with pytest.raises(GenerationConflict):
        store.save_membership(job.id, 1, [], None, "running", None)  # a fresh start over a stored one
    stored = store.load_membership(job.id)
    assert stored["generation"] == 2 and stored["failed"] == [(0, 0)] and stored["reason"] == "a"
    engine.dispose()
