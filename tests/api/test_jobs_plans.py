"""Jobs and plans through a real server, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor

from api_testkit import create_job, metric, small_job, wait_plan

from planner.failures import enumerate_failure_classes
from planner.spec import JobSpec
from planner.timeline import Timeline
from planner.validate import validate


def test_job_lifecycle(client):
    job_id = create_job(client)
    got = client.get(f"/v1/jobs/{job_id}").json()
    assert got["spec"]["cross_pipeline_p2p_ms"] == 0.75 and got["workers"] == 16 and got["op_count"] == 384
    assert got["spec"]["memory_limit_mb"] == 4.0  # default filled in: stages x max(activation_mb)
    listed = client.get("/v1/jobs", params={"limit": 1000}).json()
    assert job_id in [j["id"] for j in listed["items"]] and listed["total"] >= 1
    assert client.delete(f"/v1/jobs/{job_id}").status_code == 204
    r = client.get(f"/v1/jobs/{job_id}")
    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["field"] == "job_id"


def test_plan_is_valid_relabelled_and_served_from_the_store(client):
    job_id = create_job(client)
    spec = JobSpec.parse(small_job())
    first = wait_plan(client, job_id, [[2, 1]])
    assert first["failed"] == [[2, 1]] and first["failure_class"] == "0:1"
    assert first["iteration_ms"] >= first["lower_bound_ms"] > 0 and first["solver"]["status"]
    # The same class under another relabelling: stored plan, no new solve, its own concrete timeline.
    solves_before = metric(client, "recycle_solves_total")
    other = client.post(f"/v1/jobs/{job_id}/plans", json={"failed": [[3, 1]], "wait_s": 0})
    assert other.status_code == 200 and other.json()["failure_class"] == "0:1"
    assert other.json()["id"] != first["id"] and other.json()["iteration_ms"] == first["iteration_ms"]
    assert metric(client, "recycle_solves_total") == solves_before
    for plan in (first, other.json()):
        doc = client.get(plan["links"]["timeline"]).json()
        timeline = Timeline.model_validate(doc)
        assert doc["format"] == "recycle.timeline/v1" and doc["failed"] == plan["failed"]
        assert validate(spec, [tuple(w) for w in doc["failed"]], timeline.internal_ops()) == []
    # Asking again answers from the store with the same plan resource.
    again = client.post(f"/v1/jobs/{job_id}/plans", json={"failed": [[2, 1]], "wait_s": 0})
    assert again.status_code == 200 and again.json()["id"] == first["id"]


def test_worker_stream_and_exports(client):
    job_id = create_job(client)
    plan = wait_plan(client, job_id, [[1, 2]])
    base = plan["links"]["self"]
    stream = client.get(f"{base}/workers/0/2").json()
    assert stream["worker"] == [0, 2] and [1, 2] not in stream["stage_peers"]
    ops = [i["op"] for i in stream["instructions"]]
    assert ops.count("ALLREDUCE") == 1 and ops[-1] == "OPTIMIZER" and ops.count("F") >= 8
    dead = client.get(f"{base}/workers/1/2")
    assert dead.status_code == 409 and dead.json()["field"] == "worker"
    assert client.get(f"{base}/workers/9/0").status_code == 404
    png = client.get(f"{base}/gantt.png")
    assert png.status_code == 200, png.text
    assert png.content.startswith(b"\x89PNG") and png.headers["content-type"] == "image/png"
    trace = client.get(f"{base}/chrome-trace")
    assert trace.status_code == 200, trace.text
    events = [e for e in trace.json()["traceEvents"] if e["ph"] == "X"]
    # One complete event per op of the plan's timeline (checked against the timeline, not the exporter).
    timeline = client.get(f"{base}/timeline").json()
    assert len(events) == len(timeline["ops"])


def test_concurrent_requests_share_one_solve_and_202_polls(client):
    job_id = create_job(client, small_job(4, 4, 8))
    solves_before = metric(client, "recycle_solves_total")
    body = {"failed": [[0, 0], [1, 3]], "wait_s": 0}
    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(lambda _: client.post(f"/v1/jobs/{job_id}/plans", json=body), range(8)))
    assert {a.status_code for a in answers} <= {200, 202}
    pending = [a for a in answers if a.status_code == 202]
    assert pending, "wait_s=0 on a fresh class must answer 202 at least once"
    assert pending[0].headers["Location"].endswith(pending[0].json()["id"])
    plan = wait_plan(client, job_id, body["failed"])
    assert metric(client, "recycle_solves_total") == solves_before + 1
    assert len({a.json()["id"] for a in answers} | {plan["id"]}) == 1


def test_precompute_progress_and_then_plans_are_hits(client):
    job_id = create_job(client, small_job(2, 2, 4))
    r = client.post(f"/v1/jobs/{job_id}/precompute", json={"max_failures": 2})
    assert r.status_code == 202, r.text
    op = r.json()
    expected = sum(1 for _ in enumerate_failure_classes(JobSpec.parse(small_job(2, 2, 4)), 2))
    assert op["total"] == expected == 5 and r.headers["Location"] == f"/v1/operations/{op['id']}"
    deadline = time.monotonic() + 60
    while op["status"] == "running" and time.monotonic() < deadline:
        time.sleep(0.2)
        op = client.get(f"/v1/operations/{op['id']}").json()
        assert 0 <= op["done"] <= op["total"]
    assert op["status"] == "done" and op["done"] == op["total"] and op["progress"] == 1.0
    hits = metric(client, 'recycle_plan_lookups_total{result="hit"}')
    for failed in ([], [[0, 0]], [[1, 1]], [[0, 1], [1, 0]], [[1, 0], [1, 1]]):
        r = client.post(f"/v1/jobs/{job_id}/plans", json={"failed": failed, "wait_s": 0})
        assert r.status_code == 200 and r.json()["status"] == "done", (failed, r.text)
    assert metric(client, 'recycle_plan_lookups_total{result="hit"}') == hits + 5
    # Cancelling a finished operation leaves it as it is.
    assert client.delete(f"/v1/operations/{op['id']}").json()["status"] == "done"


def test_cancel_a_running_precompute(client):
    job_id = create_job(client, small_job(4, 4, 8))
    op = client.post(f"/v1/jobs/{job_id}/precompute", json={"max_failures": 3}).json()
    cancelled = client.delete(f"/v1/operations/{op['id']}").json()
    assert cancelled["status"] == "cancelled"
    assert client.get(f"/v1/operations/{op['id']}").json()["status"] == "cancelled"
    assert client.get("/v1/operations/nope").status_code == 404


def test_metrics_and_health(client):
    assert client.get("/healthz").json()["status"] == "ok"
    text = client.get("/metrics").text
    for name in ("recycle_http_requests_total", "recycle_solve_seconds_bucket", "recycle_plan_lookups_total"):
        assert name in text
    assert json.loads(client.get("/openapi.json").text)["info"]["title"] == "recycle plan service"
    assert client.get("/docs").status_code == 200
