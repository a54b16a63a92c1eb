"""Issue 9, finding 8: unknown fields are refused by name and nothing is coerced from strings or
booleans (every request body), and the in-memory caches stay bounded however many jobs pass."""

from __future__ import annotations

import pytest
from api_testkit import Server, create_job, metric, small_job

PROBLEM = "application/problem+json"


def refused(r, field: str) -> None:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == PROBLEM
    doc = r.json()
    assert doc["field"] == field, doc
    assert field in doc["detail"], doc


@pytest.mark.parametrize(("body", "field"), [
    ({**small_job(), "memory_limit_mbb": 100.0}, "memory_limit_mbb"),
    ({**small_job(), "stages": "4"}, "stages"),
    ({**small_job(), "microbatches": True}, "microbatches"),
    ({**small_job(), "forward_ms": "10"}, "forward_ms"),
    ({**small_job(), "p2p_ms": False}, "p2p_ms"),
])
def test_job_specs_refuse_unknown_fields_and_coercion(client, body, field):
    refused(client.post("/v1/jobs", json=body), field)


def test_other_bodies_refuse_coercion_too(client):
    job_id = create_job(client, small_job(2, 2, 4))
    base = f"/v1/jobs/{job_id}"
    refused(client.post(f"{base}/plans", json={"failed": [["0", "1"]], "wait_s": 0}), "failed.0.0")
    refused(client.post(f"{base}/plans", json={"failed": [], "wait_s": "5"}), "wait_s")
    refused(client.post(f"{base}/plans", json={"failed": [], "wait_s": True}), "wait_s")
    refused(client.post(f"{base}/precompute", json={"max_failures": "1"}), "max_failures")
    refused(client.post(f"{base}/precompute", json={"max_failures": True}), "max_failures")
    refused(client.post(f"{base}/failures", json={"worker": ["0", 1]}), "worker.0")
    refused(client.post(f"{base}/workers/0/0/heartbeat", json={"pid": "12"}), "pid")
    refused(client.post(f"{base}/workers/0/0/heartbeat", json={"pid": 1, "extra": 1}), "extra")
    assert client.get(f"{base}").json()["spec"]["pipelines"] == 2


def test_in_memory_state_is_bounded(tmp_path):
    """Jobs, finished plans and coordinator state are LRU maps with bounds (RECYCLE_CACHE_ENTRIES):
    after many jobs, each cache holds at most its bound, and an evicted job still answers."""
    server = Server(f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "server.log", RECYCLE_CACHE_ENTRIES="4")
    server.start()
    try:
        with server.client() as c:
            jobs = []
            for _ in range(12):
                job_id = create_job(c, small_job(2, 2, 4))
                jobs.append(job_id)
                r = c.post(f"/v1/jobs/{job_id}/plans", json={"failed": [], "wait_s": 30})
                assert r.status_code == 200, r.text
                assert c.get(f"/v1/jobs/{job_id}/membership").status_code == 200
            for cache in ("jobs", "finished_plans", "memberships"):
                held = metric(c, f'recycle_cache_entries{{cache="{cache}"}}')
                assert 1 <= held <= 4, (cache, held)
            first = c.get(f"/v1/jobs/{jobs[0]}")  # evicted long ago: read again from the store
            assert first.status_code == 200 and first.json()["id"] == jobs[0]
            assert c.get(f"/v1/jobs/{jobs[0]}/membership").json()["generation"] == 1
    finally:
        server.stop()


def test_precompute_of_a_huge_job_is_refused_before_enumerating(client):
    """Finding 1: a 2 x 4096 x 12 job with max_failures 2 grew to 2.9 GB enumerating stage subsets;
    the count is known by arithmetic and refused first, naming the count and the cap."""
    job_id = create_job(client, small_job(2, 4096, 12))
    for k in (2, 64):
        r = client.post(f"/v1/jobs/{job_id}/precompute", json={"max_failures": k})
        refused(r, "max_failures")
        detail = r.json()["detail"]
        assert "20000" in detail and "at least" in detail, detail
    assert client.get("/healthz").status_code == 200
    # one pipeline: no failure leaves a survivor, so only the failure-free class (the planner would
    # otherwise list every stage subset before rejecting each); k is bounded by (D - 1) x S
    single = create_job(client, small_job(1, 4096, 12))
    r = client.post(f"/v1/jobs/{single}/precompute", json={"max_failures": 64})
    assert r.status_code == 202 and r.json()["total"] == 1, r.text
