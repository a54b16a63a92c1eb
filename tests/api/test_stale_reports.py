"""Failure reports that race a generation change (issue 9).

When a worker dies, every survivor's collective breaks, so reports arrive around the change the
dead worker causes: about the dead worker (already failed: nothing to do), or blaming a live peer
whose group broke with it. Such a stale report must neither make a second generation nor evict a
live worker. A report may name the generation it is about (`generation`, what the executor's
daemon runs): one about an older generation than the service's is answered and ignored. And
concurrent reports of different workers must all land: none may undo another.

The module's server (conftest) beats every 0.2 s and declares silence after 1 s; a peer report
about a beating worker stands as "too slow" 3 x 1 s + 0.5 s after it, unless a newer generation
came (api/watchdog.py)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor

from api_testkit import create_job, small_job, wait_for

TOO_SLOW_S = 3 * 1.0 + 0.5


class Beating:
    """Registered workers beating every 0.2 s from a thread, but for those told to go quiet."""

    def __init__(self, client, job_id: str, workers):
        self.client, self.job_id, self.workers = client, job_id, list(workers)
        self.quiet: set = set()
        self.stop = threading.Event()
        for w in self.workers:
            self.beat(w)
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def beat(self, w) -> dict:
        return self.client.post(f"/v1/jobs/{self.job_id}/workers/{w[0]}/{w[1]}/heartbeat").json()

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            for w in self.workers:
                if w not in self.quiet:
                    self.beat(w)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(timeout=10)


def settled(client, job_id: str, after: int) -> dict:
    return wait_for(lambda: (lambda m: m if m["generation"] > after and m["status"] != "solving" else None)(
        client.get(f"/v1/jobs/{job_id}/membership").json()), 20, f"a generation after {after}")


def report(client, job_id: str, worker, reporter, generation=None) -> dict:
    body = {"worker": list(worker), "reporter": list(reporter), "reason": "gloo: connection closed"}
    if generation is not None:
        body["generation"] = generation
    r = client.post(f"/v1/jobs/{job_id}/failures", json=body)
    assert r.status_code == 200, r.text
    return r.json()


def test_stale_reports_after_a_change_neither_replan_nor_evict(client):
    job_id = create_job(client, small_job(2, 2, 4))
    workers = Beating(client, job_id, [(0, 0), (0, 1), (1, 0), (1, 1)])
    try:
        first = settled(client, job_id, 0)
        workers.quiet.add((1, 1))  # it dies: the watchdog declares it after 1 s of silence
        second = settled(client, job_id, first["generation"])
        assert second["failed"] == [[1, 1]] and "missed heartbeats" in second["reason"], second
        # The survivors' broken groups report right after: the dead worker again, and live peers,
        # some naming the generation their group belonged to.
        report(client, job_id, (1, 1), (0, 1))
        report(client, job_id, (0, 0), (0, 1))
        report(client, job_id, (1, 0), (0, 0), generation=first["generation"])
        time.sleep(1.0)  # well past the window in which a report counts as about the old groups
        report(client, job_id, (0, 1), (1, 0), generation=first["generation"])
        deadline = time.monotonic() + TOO_SLOW_S + 1.5
        while time.monotonic() < deadline:  # long enough for any of them to stand as "too slow"
            state = client.get(f"/v1/jobs/{job_id}/membership").json()
            assert state["generation"] == second["generation"] and state["failed"] == [[1, 1]], state
            time.sleep(0.2)
        assert state["plan_id"] == second["plan_id"] and state["status"] == "running"
        # A report naming the current generation is not stale: it still counts (as a suspect).
        fresh = report(client, job_id, (0, 1), (1, 0), generation=second["generation"])
        assert fresh["generation"] == second["generation"]
    finally:
        workers.close()


def test_concurrent_reports_of_different_workers_all_land(client):
    """Each report computed its failure set before waiting for the membership's lock: when several
    waited behind a change, the last one applied undid the others' workers (a lost failure)."""
    for attempt in range(3):
        job_id = create_job(client, small_job(4, 2, 4))
        first = settled(client, job_id, 0)
        dead = [(0, 0), (1, 1), (2, 0), (3, 1)]
        with ThreadPoolExecutor(len(dead)) as pool:
            list(pool.map(lambda w, j=job_id: client.post(f"/v1/jobs/{j}/failures", json={"worker": list(w)}),
                          dead))
        state = settled(client, job_id, first["generation"])
        state = wait_for(lambda j=job_id: (lambda m: m if m["status"] != "solving" else None)(
            client.get(f"/v1/jobs/{j}/membership").json()), 20, "the last change to settle")
        assert sorted(map(tuple, state["failed"])) == dead, (attempt, state)
        assert state["generation"] <= first["generation"] + len(dead), state
