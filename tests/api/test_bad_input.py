"""Bad input gets a 4xx problem document naming what is wrong, and the server keeps serving."""

from __future__ import annotations

import httpx
import pytest
from api_testkit import Server, create_job, small_job

PROBLEM = "application/problem+json"


def problem(r: httpx.Response, status: int, field: str | None = "any") -> dict:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == PROBLEM
    doc = r.json()
    assert doc["status"] == status and doc["detail"] and doc["title"]
    if field != "any":
        assert doc["field"] == field, doc
    return doc


@pytest.mark.parametrize(("body", "field"), [
    ({**small_job(), "pipelines": -1}, "pipelines"),
    ({**small_job(), "stages": "four"}, "stages"),
    ({**small_job(), "microbatches": 0}, "microbatches"),
    ({**small_job(), "forward_ms": [1.0, 2.0]}, "forward_ms"),
    ({**small_job(), "backward_weight_ms": -3}, "backward_weight_ms"),
    ({**small_job(), "memory_limit_mb": 0.5}, "memory_limit_mb"),
    ({k: v for k, v in small_job().items() if k != "forward_ms"}, "forward_ms"),
    ({**small_job(), "pipelines": 100, "stages": 100, "microbatches": 100}, "microbatches"),  # too big
    ({**small_job(), "forward_ms": 1e308}, "forward_ms"),  # overflowed the planner (capped at 1e7)
    # Small enough, but its busiest worker alone works 20 x 1e7 ms: beyond float milliseconds.
    ({**small_job(), "microbatches": 20, "forward_ms": 1e7}, "microbatches"),
])
def test_bad_job_specs_name_the_field(client, body, field):
    doc = problem(client.post("/v1/jobs", json=body), 422, field)
    assert field in doc["detail"]


def test_malformed_and_oversized_bodies(client):
    json_type = {"content-type": "application/json"}
    problem(client.post("/v1/jobs", content=b'{"pipelines": 4,', headers=json_type), 400)
    problem(client.post("/v1/jobs", content=b"[1, 2]", headers=json_type), 422)
    problem(client.post("/v1/jobs", content=b"x" * 2_000_000, headers=json_type), 413)

    def chunks():  # no Content-Length: the limit counts the streamed bytes
        for _ in range(40):
            yield b" " * 65536

    problem(client.post("/v1/jobs", content=chunks(), headers=json_type), 413)
    assert client.get("/healthz").status_code == 200


def test_bad_plan_and_coordinator_requests(client):
    job_id = create_job(client, small_job(2, 2, 4))
    plans = f"/v1/jobs/{job_id}/plans"
    dead_stage = problem(client.post(plans, json={"failed": [[0, 1], [1, 1]]}), 422, "failed")
    assert "stage 1" in dead_stage["detail"]
    problem(client.post(plans, json={"failed": [[0, 5]]}), 422, "failed")
    problem(client.post(plans, json={"failed": [[0]]}), 422)
    problem(client.post(plans, json={"failed": "all"}), 422, "failed")
    problem(client.post(plans, json={"failed": [], "wait_s": -1}), 422, "wait_s")
    problem(client.post(plans, json={"failed": [], "surprise": 1}), 422, "surprise")
    problem(client.get(f"{plans}/nope"), 404, "plan_id")
    problem(client.post(f"/v1/jobs/{job_id}/precompute", json={"max_failures": -2}), 422, "max_failures")
    problem(client.post(f"/v1/jobs/{job_id}/failures", json={"worker": "0,0"}), 422, "worker")
    problem(client.post(f"/v1/jobs/{job_id}/workers/0/-1/heartbeat"), 422, "stage")
    problem(client.get(f"/v1/jobs/{job_id}/workers/0/0/assignment", params={"after": "x"}), 422, "after")
    problem(client.get("/v1/jobs/does-not-exist"), 404, "job_id")
    problem(client.put("/v1/jobs"), 405)
    assert client.get("/healthz").status_code == 200


def test_precompute_refuses_too_many_classes(tmp_path):
    server = Server(f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "log", RECYCLE_MAX_PRECOMPUTE_CLASSES="10")
    server.start()
    try:
        with server.client() as c:
            job_id = create_job(c, small_job(4, 4, 8))
            r = c.post(f"/v1/jobs/{job_id}/precompute", json={"max_failures": 3})
            doc = problem(r, 422, "max_failures")
            assert "10" in doc["detail"]
    finally:
        server.stop()


def test_bearer_token_guards_everything_but_healthz(tmp_path):
    server = Server(f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "log",
                    RECYCLE_API_TOKEN="s3cret-token-abcdefgh")
    server.start()
    try:
        with server.client() as anonymous:
            assert anonymous.get("/healthz").status_code == 200
            for method, path in (("GET", "/v1/jobs"), ("POST", "/v1/jobs"), ("GET", "/metrics"),
                                 ("GET", "/openapi.json"), ("GET", "/docs")):
                r = anonymous.request(method, path, json=small_job())
                problem(r, 401)
                assert r.headers["www-authenticate"] == "Bearer"
            problem(anonymous.get("/v1/jobs", headers={"Authorization": "Bearer s3cret-token-abcdefgX"}), 401)
        with server.client(headers={"Authorization": "Bearer s3cret-token-abcdefgh"}) as c:
            assert c.get("/v1/jobs").status_code == 200 and c.get("/metrics").status_code == 200
    finally:
        server.stop()


@pytest.mark.parametrize(("args", "env", "words"), [
    (["--port", "99999"], {}, "--port: Input should be less than or equal to 65535"),
    (["--database-url", "nosuch://x"], {}, "--database-url: cannot use 'nosuch://x'"),
    (["--database-url", "sqlite:////nonexistent-dir/x.db"], {}, "--database-url: cannot connect"),
    (["--host", "192.0.2.1"], {}, "--host/--port: cannot listen on 192.0.2.1"),
    ([], {"RECYCLE_API_TOKEN": ""}, "RECYCLE_API_TOKEN: must be at least 16 characters"),
    ([], {"RECYCLE_API_TOKEN": "short"}, "RECYCLE_API_TOKEN: must be at least 16 characters"),
    ([], {"RECYCLE_API_TOKEN": " " * 20}, "RECYCLE_API_TOKEN: must be at least 16 characters"),
])
def test_serve_refuses_bad_settings_in_one_line_with_exit_2(tmp_path, args, env, words):
    import os
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "cli.main", "serve", *args], capture_output=True, text=True,
                          timeout=60, cwd=tmp_path, env={**os.environ, **env,
                                                         "PYTHONPATH": os.getcwd()})
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and words in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr
