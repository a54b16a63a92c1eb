"""Schemathesis with every check (`--checks all`) against /openapi.json of a live server with
RECYCLE_API_TOKEN set: no 5xx, every status, media type, header and body as documented, schema-valid
requests accepted and invalid ones refused, auth enforced, 405s with a true `Allow`. Every route of
the document is exercised (the server's own request metrics say so) and a job is really created.

One allowance, written in the config below: POST /v1/jobs and POST .../plans may refuse a
schema-valid body with 422, for rules JSON Schema cannot state (a per-stage list has `stages`
entries, activation_w_mb <= activation_mb, the op count within RECYCLE_MAX_PLAN_OPS; a failure set
that empties a stage of the job); and GET .../workers/{pipeline}/{stage}, which the stateful phase
reaches by following a plan's `links.workers` - a URI template - literally, `{pipeline}` and all.
Every other operation is held to the full positive check."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
from api_testkit import Server, metric

ST = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
TOKEN = "schemathesis-admin-token-0123"
CONFIG = """
[[operations]]
include-path = "/v1/jobs"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2XX", "401", "403", "404", "409", "410", "422"]

[[operations]]
include-path = "/v1/jobs/{job_id}/plans"
include-method = "POST"
checks.positive_data_acceptance.expected-statuses = ["2XX", "401", "403", "404", "409", "422"]

[[operations]]
include-path = "/v1/jobs/{job_id}/plans/{plan_id}/workers/{pipeline}/{stage}"
include-method = "GET"
checks.positive_data_acceptance.expected-statuses = ["2XX", "401", "403", "404", "409", "422"]
"""


@pytest.mark.slow
@pytest.mark.skipif(ST is None, reason="schemathesis is not installed (the dev extra)")
def test_openapi_contract_holds_under_every_check(tmp_path):
    (tmp_path / "schemathesis.toml").write_text(CONFIG)
    # Long-polls and plan waits end within 2 s: under the request timeout, so none reads as a hang.
    server = Server(f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "server.log", RECYCLE_API_TOKEN=TOKEN,
                    RECYCLE_MAX_WAIT_S="2").start()
    try:
        auth = {"Authorization": f"Bearer {TOKEN}"}
        document = httpx.get(f"{server.url}/openapi.json", headers=auth, timeout=30).json()
        run = subprocess.run(
            [ST, "--config-file", str(tmp_path / "schemathesis.toml"), "run", f"{server.url}/openapi.json",
             "-H", f"Authorization: Bearer {TOKEN}", "--checks", "all", "--max-examples", "5",
             "--generation-deterministic", "--request-timeout", "20", "--workers", "1", "--no-color"],
            capture_output=True, text=True, timeout=240, cwd=tmp_path)
        assert run.returncode == 0, run.stdout[-8000:] + run.stderr[-2000:]
        routes = {(method.upper(), path) for path, ops in document["paths"].items() for method in ops}
        assert f"Selected: {len(routes)}/{len(routes)}" in run.stdout
        assert f"Tested: {len(routes)}" in run.stdout
        with httpx.Client(base_url=server.url, headers=auth, timeout=30) as c:
            for method, path in routes:  # every route was called (counted by its template)
                calls = sum(float(line.rsplit(" ", 1)[1]) for line in c.get("/metrics").text.splitlines()
                            if line.startswith("recycle_http_requests_total{")
                            and f'method="{method}"' in line and f'route="{path}"' in line)
                assert calls > 0, (method, path)
            assert metric(c, 'recycle_http_requests_total{method="POST",route="/v1/jobs",status="201"}') > 0
        assert '"level": "error"' not in (tmp_path / "server.log").read_text()
    finally:
        server.stop()
