"""Fixtures shared by the executor's live tests."""

from __future__ import annotations

import pytest

from executor.service import LocalService


@pytest.fixture(scope="module")
def service(tmp_path_factory):
    """One real `recycle serve` (SQLite in tmp, heuristic plans in 2 s) per test module."""
    svc = LocalService(tmp_path_factory.mktemp("service"),
                       {"RECYCLE_USE_CP": "false", "RECYCLE_SOLVE_TIME_LIMIT_S": "2"})
    svc.start()
    yield svc
    svc.stop()
