"""The job's rendezvous address (issue 11: the store's address comes from the service): registered
by `recycle rendezvous --service`, read by workers started without --store; scoped like every
coordinator route, validated, and gone with its job."""

from __future__ import annotations

from collections.abc import Iterator

import httpx
import pytest
from api_testkit import Server, small_job

ADMIN = "admin-token-rendezvous-0123456789"


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> Iterator[Server]:
    tmp = tmp_path_factory.mktemp("rendezvous")
    srv = Server(f"sqlite:///{tmp / 'r.db'}", tmp / "server.log", RECYCLE_API_TOKEN=ADMIN).start()
    try:
        yield srv
    finally:
        srv.stop()


def _job(admin: httpx.Client) -> tuple[str, httpx.Client]:
    body = admin.post("/v1/jobs", json=small_job(2, 2, 4)).json()
    return body["id"], httpx.Client(base_url=str(admin.base_url), timeout=30,
                                    headers={"Authorization": f"Bearer {body['worker_token']}"})


def test_registered_address_is_what_workers_read_and_a_restart_replaces_it(server):
    with server.client(headers={"Authorization": f"Bearer {ADMIN}"}) as admin:
        job, worker = _job(admin)
        url = f"/v1/jobs/{job}/rendezvous"
        missing = worker.get(url)
        assert missing.status_code == 404 and "recycle rendezvous" in missing.json()["detail"]
        assert worker.put(url, json={"address": "10.0.0.7:29400"}).status_code == 200
        assert worker.get(url).json() == {"address": "10.0.0.7:29400"}
        assert admin.put(url, json={"address": "node-3.cluster:29500"}).status_code == 200  # restarted
        assert worker.get(url).json() == {"address": "node-3.cluster:29500"}
        assert admin.delete(f"/v1/jobs/{job}").status_code == 204
        assert admin.get(url).status_code == 404
        worker.close()


@pytest.mark.parametrize("address", ["nohost", "10.0.0.7:", ":29400", "10.0.0.7:99999", "a b:1", 7])
def test_a_bad_address_is_refused_naming_the_field(server, address):
    with server.client(headers={"Authorization": f"Bearer {ADMIN}"}) as admin:
        job, worker = _job(admin)
        r = worker.put(f"/v1/jobs/{job}/rendezvous", json={"address": address})
        assert r.status_code == 422, r.text
        assert "address" in r.text
        assert worker.get(f"/v1/jobs/{job}/rendezvous").status_code == 404  # nothing stored
        worker.close()


def test_only_the_jobs_own_tokens_reach_it(server):
    with server.client(headers={"Authorization": f"Bearer {ADMIN}"}) as admin:
        job, worker = _job(admin)
        other, other_worker = _job(admin)
        assert other_worker.put(f"/v1/jobs/{job}/rendezvous", json={"address": "h:1"}).status_code == 403
        assert other_worker.get(f"/v1/jobs/{job}/rendezvous").status_code == 403
        with server.client() as anonymous:
            assert anonymous.put(f"/v1/jobs/{job}/rendezvous", json={"address": "h:1"}).status_code == 401
        worker.close()
        other_worker.close()
