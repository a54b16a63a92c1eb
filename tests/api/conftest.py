"""Fixtures for the API tests: one real server per store per module (see api_testkit)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).parent))

from api_testkit import STORES, Server, database_for  # noqa: E402


@pytest.fixture(scope="module", params=STORES)
def server(request, tmp_path_factory) -> Iterator[Server]:
    """A server per store for a whole module (start-up is the slow part)."""
    tmp = tmp_path_factory.mktemp(f"api-{request.param}")
    urls = database_for(request.param, tmp)
    srv = Server(next(urls), tmp / "server.log", RECYCLE_HEARTBEAT_INTERVAL_S="0.2",
                 RECYCLE_HEARTBEAT_TIMEOUT_S="1.0").start()
    try:
        yield srv
    finally:
        srv.stop()
        for _ in urls:
            pass


@pytest.fixture
def client(server: Server) -> Iterator[httpx.Client]:
    with server.client() as c:
        yield c


