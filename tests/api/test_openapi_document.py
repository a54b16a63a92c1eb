"""What schemathesis's full checks found, each pinned by a direct test: the document lists errors as
problem documents with the statuses every route may answer, a 405's `Allow` names every method of
the path, a job whose activations take 0 MB can be listed (its filled-in 0 MB memory limit was
refused on read: 500), an integral JSON number is an integer, and the rendezvous port range is in
the pattern the document shows."""

from __future__ import annotations

import re

from api_testkit import create_job, small_job

PROBLEM = "application/problem+json"


def test_the_document_lists_problem_documents_and_common_statuses(client):
    doc = client.get("/openapi.json").json()
    for path, ops in doc["paths"].items():
        for method, op in ops.items():
            responses = op["responses"]
            for status in ("413", "500"):
                assert status in responses, (method, path, status)
            if path != "/healthz":
                assert {"401", "403"} <= set(responses), (method, path)
            if "requestBody" in op:
                assert "400" in responses, (method, path)
            for status, response in responses.items():
                if int(status) >= 400:
                    assert list(response["content"]) == [PROBLEM], (method, path, status)
    worker = doc["components"]["schemas"]["WorkerReport"]["properties"]["worker"]
    assert "prefixItems" not in worker and worker["items"] == {"type": "integer"}
    forward = doc["components"]["schemas"]["JobSpec"]["properties"]["forward_ms"]["anyOf"]
    assert {"type": "number", "exclusiveMinimum": 0} in forward


def test_a_405_allows_every_method_of_the_path(client):
    r = client.request("OPTIONS", "/v1/jobs")
    assert r.status_code == 405 and r.headers["content-type"] == PROBLEM
    assert set(re.split(r",\s*", r.headers["allow"])) >= {"GET", "POST"}
    job_id = create_job(client, small_job(2, 2, 4))
    r = client.put(f"/v1/jobs/{job_id}")
    assert r.status_code == 405 and {"GET", "DELETE"} <= set(re.split(r",\s*", r.headers["allow"]))


def test_a_job_whose_activations_take_no_memory_is_listed(client):
    job_id = create_job(client, {**small_job(2, 2, 4), "activation_mb": 0.0})
    got = client.get(f"/v1/jobs/{job_id}")
    assert got.status_code == 200 and got.json()["spec"]["memory_limit_mb"] == 0.0, got.text
    listed = client.get("/v1/jobs", params={"limit": 1000})
    assert listed.status_code == 200 and job_id in {j["id"] for j in listed.json()["items"]}, listed.text


def test_an_integral_number_is_an_integer_but_strings_and_booleans_are_not(client):
    job_id = create_job(client, small_job(2, 2, 4))
    r = client.post(f"/v1/jobs/{job_id}/precompute", json={"max_failures": 1.0})
    assert r.status_code == 202 and r.json()["max_failures"] == 1, r.text
    for bad in ("1", True, 1.5):
        r = client.post(f"/v1/jobs/{job_id}/precompute", json={"max_failures": bad})
        assert r.status_code == 422 and r.json()["field"] == "max_failures", (bad, r.text)
    r = client.post(f"/v1/jobs/{job_id}/failures", json={"worker": [0.0, 1.0]})
    assert r.status_code == 200 and r.json()["failed"] == [[0, 1]], r.text


def test_the_rendezvous_port_range_is_the_documented_pattern(client):
    job_id = create_job(client, small_job(2, 2, 4))
    for address in ("h:0", "h:65536", "h:99999"):
        r = client.put(f"/v1/jobs/{job_id}/rendezvous", json={"address": address})
        assert r.status_code == 422 and r.json()["field"] == "address", (address, r.text)
    for address in ("h:1", "10.0.0.1:65535", "node-7.cluster:29400"):
        r = client.put(f"/v1/jobs/{job_id}/rendezvous", json={"address": address})
        assert r.status_code == 200, (address, r.text)
