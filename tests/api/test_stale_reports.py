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

import httpx
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


def membership(client, job_id: str) -> dict | None:
    r = client.get(f"/v1/jobs/{job_id}/membership")
    return r.json() if r.status_code == 200 else None  # a 503 (database busy) is asked again


def settled(client, job_id: str, after: int) -> dict:
    return wait_for(lambda: (lambda m: m if m and m["generation"] > after and m["status"] != "solving"
                             else None)(membership(client, job_id)), 20, f"a generation after {after}")


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
        # The survivors' broken groups report right after: the dead worker again (final, but it is
        # failed already), and live peers, naming the generation their group belonged to. (A peer
        # report naming none counts as stale only within confirm_s of the change, which a slow
        # solve of the new plan can outlast: the executor's daemons name it.)
        report(client, job_id, (1, 1), (0, 1))
        report(client, job_id, (0, 0), (0, 1), generation=first["generation"])
        report(client, job_id, (1, 0), (0, 0), generation=first["generation"])
        time.sleep(1.0)  # well past the window in which a report counts as about the old groups
        report(client, job_id, (0, 1), (1, 0), generation=first["generation"])
        deadline, state = time.monotonic() + TOO_SLOW_S + 1.5, second
        while time.monotonic() < deadline:  # long enough for any of them to stand as "too slow"
            state = membership(client, job_id) or state
            assert state["generation"] == second["generation"] and state["failed"] == [[1, 1]], state
            time.sleep(0.2)
        assert state["plan_id"] == second["plan_id"] and state["status"] == "running", (second, state)
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
        state = wait_for(lambda j=job_id: (lambda m: m if m and m["status"] != "solving" else None)(
            membership(client, j)), 20, "the last change to settle")
        assert sorted(map(tuple, state["failed"])) == dead, (attempt, state)
        assert state["generation"] <= first["generation"] + len(dead), state


def test_no_reader_sees_a_new_generation_with_the_old_plan(client):
    """While a change stores its generation, the membership read half-changed: the new generation
    and failure set with the old generation's plan, `running` - so an assignment asked for then
    handed the new generation with the old plan's instructions (found by the test above)."""
    job_id = create_job(client, small_job(2, 2, 4))
    settled(client, job_id, 0)
    stop, states = threading.Event(), []

    def read() -> None:
        with httpx.Client(base_url=str(client.base_url), timeout=30) as c:
            while not stop.is_set():
                m = membership(c, job_id)
                if m and m["status"] == "running":
                    states.append((m["generation"], m["plan_id"], tuple(map(tuple, m["failed"]))))

    readers = [threading.Thread(target=read, daemon=True) for _ in range(2)]
    for t in readers:
        t.start()
    try:
        generation = 1
        for _ in range(8):  # fail and rejoin [1, 1]: after the first two, both plans are stored
            client.post(f"/v1/jobs/{job_id}/failures", json={"worker": [1, 1]})
            generation = settled(client, job_id, generation)["generation"]
            client.post(f"/v1/jobs/{job_id}/rejoins", json={"worker": [1, 1]})
            generation = settled(client, job_id, generation)["generation"]
    finally:
        stop.set()
        for t in readers:
            t.join(timeout=30)
    plans = {}
    for gen, plan_id, failed in set(states):
        if plan_id not in plans:
            plan = client.get(f"/v1/jobs/{job_id}/plans/{plan_id}").json()
            plans[plan_id] = tuple(map(tuple, plan["failed"]))
        assert plans[plan_id] == failed, f"generation {gen} failed={failed}, plan of {plans[plan_id]}"
    assert len(states) > 50, len(states)
