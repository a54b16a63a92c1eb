"""The coordinator the worker daemons follow: register, long-poll, failures, rejoins, missed beats.

The module's server beats every 0.2 s and declares a worker failed after 1 s of silence.
"""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from api_testkit import create_job, small_job

from executor.membership import alive_workers


def poll(client, job_id, worker, after, wait_s=20.0):
    p, s = worker
    r = client.get(f"/v1/jobs/{job_id}/workers/{p}/{s}/assignment", params={"after": after, "wait_s": wait_s})
    assert r.status_code in (200, 204), r.text
    return None if r.status_code == 204 else r.json()


@contextmanager
def beating(client, job_id, worker):
    """Keep a registered worker beating (every 0.2 s) so the 1 s timeout never fails it mid-test."""
    stop = threading.Event()

    def beat():
        while not stop.wait(0.2):
            client.post(f"/v1/jobs/{job_id}/workers/{worker[0]}/{worker[1]}/heartbeat")

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(timeout=10)


def test_register_then_failure_moves_every_worker_to_the_next_generation(client):
    job_id = create_job(client, small_job(2, 2, 4))
    reg = client.post(f"/v1/jobs/{job_id}/workers/0/0/heartbeat",
                      json={"address": "10.0.0.1:29500", "pid": 42})
    assert reg.status_code == 200 and reg.json()["generation"] == 1 and reg.json()["excluded"] is False
    with beating(client, job_id, (0, 0)):
        registered_then_failure(client, job_id)


def registered_then_failure(client, job_id):
    first = poll(client, job_id, (0, 0), after=0)
    assert first["generation"] == 1 and first["status"] == "running" and first["failed"] == []
    assert first["instructions"]["worker"] == [0, 0] and len(alive_workers(first)) == 4
    assert first["iteration_ms"] > 0
    # Everyone long-polls "after 1"; one failure report wakes them all with generation 2.
    workers = [(0, 0), (0, 1), (1, 0)]
    with ThreadPoolExecutor(len(workers)) as pool:
        waiting = [pool.submit(poll, client, job_id, w, 1) for w in workers]
        time.sleep(0.3)
        report = client.post(f"/v1/jobs/{job_id}/failures", json={"worker": [1, 1], "reporter": [0, 1]})
        assert report.status_code == 200 and report.json()["generation"] == 2
        answers = [f.result(timeout=30) for f in waiting]
    for worker, a in zip(workers, answers, strict=True):
        assert a["generation"] == 2 and a["failed"] == [[1, 1]] and a["status"] == "running"
        assert a["instructions"]["worker"] == list(worker) and (1, 1) not in alive_workers(a)
    # The [0, 1] survivor now also runs pipeline 1's stage-1 micro-batches.
    stage1 = [i for i in answers[1]["instructions"]["instructions"] if i["op"] == "F"]
    assert {tuple(i["microbatch"])[0] for i in stage1} == {0, 1}
    # The failed worker is told it is excluded; reporting it again changes nothing.
    assert poll(client, job_id, (1, 1), after=1)["status"] == "excluded"
    assert client.post(f"/v1/jobs/{job_id}/failures", json={"worker": [1, 1]}).json()["generation"] == 2
    # Rejoin: generation 3 with no failures; rejoining twice is a conflict.
    rejoin = client.post(f"/v1/jobs/{job_id}/rejoins", json={"worker": [1, 1]})
    assert rejoin.status_code == 200 and rejoin.json()["generation"] == 3
    assert poll(client, job_id, (1, 1), after=2)["failed"] == []
    again = client.post(f"/v1/jobs/{job_id}/rejoins", json={"worker": [1, 1]})
    assert again.status_code == 409 and again.json()["field"] == "worker"
    members = client.get(f"/v1/jobs/{job_id}/membership").json()
    assert members["generation"] == 3
    registered = {"worker": [0, 0], "address": "10.0.0.1:29500", "pid": 42}
    assert registered.items() <= members["workers"][0].items()


def test_a_stage_without_survivors_waits_for_a_rejoin(client):
    job_id = create_job(client, small_job(2, 2, 4))
    assert client.post(f"/v1/jobs/{job_id}/failures", json={"worker": [0, 1]}).json()["status"] in (
        "running", "solving")
    waiting = client.post(f"/v1/jobs/{job_id}/failures", json={"worker": [1, 1]}).json()
    assert waiting["status"] == "waiting" and "stage 1 has no alive worker" in waiting["reason"]
    a = poll(client, job_id, (0, 0), after=2)
    assert a["status"] == "waiting" and a["instructions"] is None and "restores the newest checkpoint" in a[
        "reason"]
    # The waiting generation survives a reload of the membership from the database.
    assert client.get(f"/v1/jobs/{job_id}/membership").json()["status"] == "waiting"
    # A rejoin to the lost stage brings the job back with a plan that has [0, 1] alive.
    client.post(f"/v1/jobs/{job_id}/rejoins", json={"worker": [0, 1]})
    back = poll(client, job_id, (0, 0), after=3)
    assert back["status"] == "running" and back["failed"] == [[1, 1]] and (0, 1) in alive_workers(back)


def test_missed_heartbeats_fail_a_worker(client):
    job_id = create_job(client, small_job(2, 2, 4))
    for w in ((0, 0), (1, 0)):
        client.post(f"/v1/jobs/{job_id}/workers/{w[0]}/{w[1]}/heartbeat")
    generation = client.post(f"/v1/jobs/{job_id}/workers/0/0/heartbeat").json()["generation"]
    # Only [0, 0] keeps beating; [1, 0] goes silent past the 1 s timeout.
    deadline = time.monotonic() + 10
    state = None
    while time.monotonic() < deadline:
        state = client.post(f"/v1/jobs/{job_id}/workers/0/0/heartbeat").json()
        if state["generation"] > generation:
            break
        time.sleep(0.2)
    assert state["failed"] == [[1, 0]] and "missed heartbeats" in state["reason"], state
    assert poll(client, job_id, (1, 0), after=generation)["status"] == "excluded"


def test_a_peer_report_about_a_beating_worker_waits_for_its_heartbeats(client):
    # A dying gloo group breaks for every member, so a survivor may blame a live peer: its report
    # stands only if the reported worker then misses its beats (half the 1 s timeout here), or if no
    # new generation comes long after (3 x timeout + 0.5 s: too slow, see test_worker_tokens).
    job_id = create_job(client, small_job(2, 2, 4))
    for w in ((0, 0), (0, 1), (1, 0)):
        client.post(f"/v1/jobs/{job_id}/workers/{w[0]}/{w[1]}/heartbeat")
    generation = poll(client, job_id, (0, 0), after=0)["generation"]
    report = client.post(f"/v1/jobs/{job_id}/failures", json={"worker": [0, 1], "reporter": [0, 0]})
    assert report.status_code == 200 and report.json()["generation"] == generation  # not yet
    deadline = time.monotonic() + 1.5
    while time.monotonic() < deadline:  # [0, 1] keeps beating: the report waits
        for w in ((0, 0), (0, 1), (1, 0)):
            client.post(f"/v1/jobs/{job_id}/workers/{w[0]}/{w[1]}/heartbeat")
        time.sleep(0.1)
    state = client.post(f"/v1/jobs/{job_id}/workers/0/0/heartbeat").json()
    assert state["generation"] == generation and state["failed"] == []
    # [1, 0] is reported and goes silent: failed after its missed beats, well before the 1 s timeout.
    reported_at = time.monotonic()
    client.post(f"/v1/jobs/{job_id}/failures", json={"worker": [1, 0], "reporter": [0, 0]})
    while time.monotonic() - reported_at < 5:
        state = client.post(f"/v1/jobs/{job_id}/workers/0/0/heartbeat").json()
        client.post(f"/v1/jobs/{job_id}/workers/0/1/heartbeat")
        if state["generation"] > generation:
            break
        time.sleep(0.05)
    assert state["failed"] == [[1, 0]] and "reported by a peer" in state["reason"]


def test_refusals_and_long_poll_timeout(client):
    job_id = create_job(client, small_job(2, 2, 4))
    other = create_job(client, small_job(2, 2, 4))
    assert poll(client, job_id, (0, 0), after=0)["generation"] == 1
    started = time.monotonic()
    assert poll(client, job_id, (0, 0), after=1, wait_s=0.5) is None  # 204: nothing newer
    assert time.monotonic() - started < 5
    for path, body in ((f"/v1/jobs/{job_id}/workers/2/0/heartbeat", None),
                       (f"/v1/jobs/{job_id}/failures", {"worker": [0, 7]}),
                       (f"/v1/jobs/{job_id}/failures", {"worker": [0, 0], "reporter": [5, 5]}),
                       (f"/v1/jobs/{job_id}/rejoins", {"worker": [3, 0]})):
        r = client.post(path, json=body)
        assert r.status_code == 403, (path, r.text)
        assert r.headers["content-type"] == "application/problem+json"
    r = client.get(f"/v1/jobs/{job_id}/workers/0/9/assignment", params={"wait_s": 0})
    assert r.status_code == 403
    client.delete(f"/v1/jobs/{other}")
    r = client.post(f"/v1/jobs/{other}/failures", json={"worker": [0, 0]})
    assert r.status_code == 404 and r.json()["field"] == "job_id"


def test_a_workers_alive_set_is_derived_from_its_answer(client):
    """3 x 2 job: [1, 0] fails, then rejoins. Each worker builds its process groups from the alive
    set it derives from the answer (`executor.membership.alive_workers`): the job's grid less the
    failure set, which is all the answer carries of the membership."""
    job_id = create_job(client, small_job(3, 2, 6))
    everyone = [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0), (2, 1)]
    first = poll(client, job_id, (2, 1), after=0)
    assert (first["pipelines"], first["stages"]) == (3, 2) and alive_workers(first) == everyone
    assert "alive" not in first  # not listed: it grew with the job, sent to every worker
    failed = client.post(f"/v1/jobs/{job_id}/failures", json={"worker": [1, 0]})
    assert failed.status_code == 200 and failed.json()["generation"] == 2, failed.text
    for worker in ((0, 0), (1, 1), (2, 1)):
        a = poll(client, job_id, worker, after=1)
        assert (a["generation"], a["status"]) == (2, "running")
        assert alive_workers(a) == [(0, 0), (0, 1), (1, 1), (2, 0), (2, 1)]
    excluded = poll(client, job_id, (1, 0), after=1)
    assert excluded["status"] == "excluded" and (1, 0) not in alive_workers(excluded)
    rejoined = client.post(f"/v1/jobs/{job_id}/rejoins", json={"worker": [1, 0]})
    assert rejoined.status_code == 200 and rejoined.json()["generation"] == 3, rejoined.text
    for worker in ((1, 0), (2, 0)):
        a = poll(client, job_id, worker, after=2)
        assert (a["generation"], a["status"], a["failed"]) == (3, "running", [])
        assert alive_workers(a) == everyone
