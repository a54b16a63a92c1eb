"""Issue 9, finding 3: a job deleted while it is being read stays deleted, and a delete cancels the
job's running precompute (its operation answers `cancelled`, not 404 while its solves go on)."""

from __future__ import annotations

import threading
import time

import httpx
import pytest
from api_testkit import POSTGRES_URL, STORES, Server, create_job, database_for, small_job, wait_for


@pytest.mark.postgres
@pytest.mark.skipif(not POSTGRES_URL, reason="needs RECYCLE_TEST_POSTGRES_URL (table locks order the race)")
def test_a_job_deleted_while_being_read_stays_deleted(tmp_path):
    """A row lock orders the race: a delete is under way (its transaction waits on the job's
    registration row) when a read of the job, not cached, still sees the row; then the delete commits.
    Afterwards the job is gone: a read, a plan request and a heartbeat are 404s, never 200 or 500."""
    from sqlalchemy import create_engine, text

    urls = database_for("postgres", tmp_path)
    server = Server(next(urls), tmp_path / "server.log")
    try:
        server.start()
        with server.client() as c:
            job_id = create_job(c, small_job(2, 2, 4))
            assert c.post(f"/v1/jobs/{job_id}/workers/0/0/heartbeat").status_code == 200  # a registration
            # Its first generation's plan solved: nothing pending makes the restart load the job.
            wait_for(lambda: c.get(f"/v1/jobs/{job_id}/membership").json()["status"] == "running", 60,
                     "generation 1 to run")
        server.stop()
        server.start()  # a fresh process: the job is not cached, a GET reads the database
        engine = create_engine(server.database_url)
        results: dict[str, int] = {}

        def call(name: str, method: str) -> None:
            with server.client() as c:
                results[name] = c.request(method, f"/v1/jobs/{job_id}").status_code

        def waiting_on_locks() -> int:
            with engine.connect() as conn:
                return conn.execute(text("SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = "
                                         "'Lock' AND datname = current_database()")).scalar_one()

        with engine.connect() as child_lock:
            # The delete's transaction waits on the job's registration row...
            child_lock.execute(text("SELECT * FROM registrations WHERE job_id = :j FOR UPDATE"),
                               {"j": job_id})
            deleter = threading.Thread(target=call, args=("delete", "DELETE"))
            deleter.start()
            wait_for(lambda: waiting_on_locks() >= 1, 30, "the DELETE to wait on the job's registration")
            # ... so a read now still sees the job's row (the delete has not committed).
            call("get", "GET")
            assert results["get"] == 200, results
            child_lock.rollback()  # now the delete commits
            deleter.join(60)
        engine.dispose()
        assert results["delete"] == 204, results
        with server.client() as c:
            assert c.get(f"/v1/jobs/{job_id}").status_code == 404
            r = c.post(f"/v1/jobs/{job_id}/plans", json={"failed": [], "wait_s": 0})
            assert r.status_code == 404, r.text
            hb = c.post(f"/v1/jobs/{job_id}/workers/0/0/heartbeat")
            assert hb.status_code == 404, hb.text
    finally:
        server.stop()
        for _ in urls:
            pass


@pytest.mark.parametrize("store", STORES)
def test_deleting_a_job_cancels_its_running_precompute(store, tmp_path):
    urls = database_for(store, tmp_path)
    server = Server(next(urls), tmp_path / "server.log")
    try:
        server.start()
        with server.client() as c:
            job_id = create_job(c, small_job(4, 4, 8))
            op = c.post(f"/v1/jobs/{job_id}/precompute", json={"max_failures": 3}).json()
            wait_for(lambda: c.get(f"/v1/operations/{op['id']}").json()["done"] >= 1, 60, "one class solved")
            assert c.delete(f"/v1/jobs/{job_id}").status_code == 204
            after = c.get(f"/v1/operations/{op['id']}")
            assert after.status_code == 200, after.text
            assert after.json()["status"] == "cancelled" and "deleted" in after.json()["error"]
            # It stays cancelled (nothing of the job is written any more) and the job is gone.
            time.sleep(0.5)
            assert c.get(f"/v1/operations/{op['id']}").json()["status"] == "cancelled"
            assert c.get(f"/v1/jobs/{job_id}").status_code == 404
            assert c.get("/healthz").status_code == 200
            assert "Traceback" not in server.log_path.read_text()
    finally:
        server.stop()
        for _ in urls:
            pass


def test_requests_racing_a_delete_never_answer_500(tmp_path):
    """Plan requests, heartbeats and reads of a job while it is deleted answer 2xx or 404, never 500."""
    server = Server(f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "server.log")
    server.start()
    try:
        with server.client() as c:
            jobs = [create_job(c, small_job(2, 2, 4)) for _ in range(6)]
        statuses: list[int] = []

        def hammer(job_id: str) -> None:
            with server.client() as c:
                for i in range(30):
                    for method, path, body in (
                            ("POST", f"/v1/jobs/{job_id}/plans", {"failed": [[i % 2, 0]], "wait_s": 0}),
                            ("POST", f"/v1/jobs/{job_id}/workers/{i % 2}/1/heartbeat", None),
                            ("GET", f"/v1/jobs/{job_id}/membership", None)):
                        try:
                            statuses.append(c.request(method, path, json=body).status_code)
                        except httpx.TransportError:
                            statuses.append(-1)

        threads = [threading.Thread(target=hammer, args=(j,)) for j in jobs]
        for t in threads:
            t.start()
        with server.client() as c:
            for job_id in jobs:
                assert c.delete(f"/v1/jobs/{job_id}").status_code == 204
        for t in threads:
            t.join(120)
        assert statuses and all(s in (200, 201, 202, 404) for s in statuses), sorted(set(statuses))
        with server.client() as c:
            for job_id in jobs:
                assert c.get(f"/v1/jobs/{job_id}/membership").status_code == 404
    finally:
        server.stop()
