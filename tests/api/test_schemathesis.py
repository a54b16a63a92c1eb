"""Schemathesis against /openapi.json of a live server: no 5xx, every response matches its schema."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from api_testkit import Server

ST = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")


@pytest.mark.slow
@pytest.mark.skipif(ST is None, reason="schemathesis is not installed (the dev extra)")
def test_openapi_contract_holds(tmp_path):
    server = Server(f"sqlite:///{tmp_path / 'r.db'}", tmp_path / "server.log").start()
    try:
        run = subprocess.run(
            [ST, "run", f"{server.url}/openapi.json", "--checks",
             "not_a_server_error,response_schema_conformance", "--max-examples", "5",
             "--generation-deterministic", "--request-timeout", "20", "--workers", "1", "--no-color"],
            capture_output=True, text=True, timeout=240)
        assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
        assert " passed" in run.stdout
        assert '"level": "error"' not in (tmp_path / "server.log").read_text()
    finally:
        server.stop()
