"""A worker's side of the coordinator: heartbeats, the long-polled assignment, failure and rejoin
reports, over HTTP (httpx) only; the executor never imports the service.

Two daemon threads per worker, each with its own httpx client:

- heartbeat: `POST .../workers/{p}/{s}/heartbeat` every `heartbeat_interval_s` (the service says
  how often). Its `excluded` answer is not read here: exclusion reaches the worker as a newer
  assignment through the long-poll.
- long-poll: `GET .../assignment?after=G&wait_s=...`; every newer settled generation is stored as
  `latest` and sets `changed`, the event the main loop's waits check (see comms.interruptible).

The main thread only reads `latest` and calls `report_failure` / `rejoin`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from typing import Any

import httpx

Worker = tuple[int, int]

REGISTRATION_HEADER = "X-Recycle-Registration"
"""Sent on every call once the service bound this worker's registration to this process."""

POLL_WAIT_S = 20.0
"""Long-poll length; the HTTP read timeout is this plus a margin (the service's hierarchy)."""


def alive_workers(assignment: dict[str, Any]) -> list[Worker]:
    """A generation's alive workers, sorted: the job's `pipelines` x `stages` grid less `failed`.
    The service sends the grid's shape and the failure set rather than the list, which would grow
    with the job and go to every worker after every change (docs/design.md, coordinator)."""
    failed = {(p, s) for p, s in assignment["failed"]}
    return [(p, s) for p in range(assignment["pipelines"]) for s in range(assignment["stages"])
            if (p, s) not in failed]


class MembershipError(RuntimeError):
    """The service refused or could not be reached; the message says which and why."""


def _detail(resp: httpx.Response) -> str:
    try:
        body = resp.json()
        return str(body.get("detail") or body.get("title") or body)
    except ValueError:
        return resp.text[:200]


class Membership:
    def __init__(self, url: str, job_id: str, worker: Worker, token: str | None = None,
                 request_timeout_s: float = 10.0, service_lost_s: float = 30.0):
        self.base = f"{url.rstrip('/')}/v1/jobs/{job_id}"
        self.worker = worker
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self.request_timeout_s = request_timeout_s
        self.service_lost_s = service_lost_s
        self.interval_s = 1.0
        self.latest: dict[str, Any] | None = None
        self.changed = threading.Event()
        self.error: str | None = None
        """Set when the service cannot be reached for `service_lost_s` (also sets `changed`)."""
        self._stop = threading.Event()
        self._after = 0
        self._adopted: int | None = None
        """The generation the main loop runs (what a failure it reports is about)."""
        self._lock = threading.Lock()
        self._client = self._new_client()

    def _new_client(self, read_s: float | None = None) -> httpx.Client:
        timeout = httpx.Timeout(self.request_timeout_s, read=read_s or self.request_timeout_s)
        return httpx.Client(base_url=self.base, headers=self.headers, timeout=timeout)

    def _call(self, client: httpx.Client, method: str, path: str, **kw) -> httpx.Response:
        try:
            return client.request(method, path, **kw)
        except httpx.TransportError as exc:
            raise MembershipError(f"service at {self.base} unreachable: {exc}") from exc

    # ------------------------------------------------------------------------------- requests
    def register(self) -> dict[str, Any]:
        """The first heartbeat registers this worker; returns the membership state.

        With a job's worker token the service binds the registration to this process: it answers a
        registration id, sent as X-Recycle-Registration from then on. A restarted worker whose old
        process is still counted alive is refused (409) until that one is declared failed: retry,
        bounded by `service_lost_s`."""
        p, s = self.worker
        deadline = time.monotonic() + self.service_lost_s
        while True:
            resp = self._call(self._client, "POST", f"/workers/{p}/{s}/heartbeat", json={"pid": os.getpid()})
            if resp.status_code != 409 or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        if resp.status_code != 200:
            raise MembershipError(f"registering worker {[p, s]} refused ({resp.status_code}): "
                                  f"{_detail(resp)}")
        state = resp.json()
        if state.get("registration"):
            self.headers[REGISTRATION_HEADER] = state["registration"]
            self._client.headers[REGISTRATION_HEADER] = state["registration"]
        self.interval_s = float(state["heartbeat_interval_s"])
        return state

    def report_failure(self, peer: Worker, reason: str) -> None:
        """Tell the coordinator a peer is gone (idempotent on the service side)."""
        body = {"worker": list(peer), "reporter": list(self.worker), "reason": reason[:500]}
        if self._adopted is not None:  # a report about an older generation is ignored as stale
            body["generation"] = self._adopted
        # Unreachable: the heartbeat timeout still catches it; the caller waits for the generation.
        with contextlib.suppress(MembershipError):
            self._call(self._client, "POST", "/failures", json=body)

    def rejoin(self) -> dict[str, Any]:
        """A restarted worker is back. If the coordinator has not yet noticed this worker's previous
        life ended (409: not in the failure set), report it failed first, then rejoin."""
        resp = self._call(self._client, "POST", "/rejoins", json={"worker": list(self.worker)})
        if resp.status_code == 409:
            gone = {"worker": list(self.worker), "reporter": list(self.worker),
                    "reason": "restarted: the previous process is gone"}
            self._call(self._client, "POST", "/failures", json=gone)
            resp = self._call(self._client, "POST", "/rejoins", json={"worker": list(self.worker)})
        if resp.status_code != 200:
            raise MembershipError(f"rejoin of worker {list(self.worker)} refused ({resp.status_code}): "
                                  f"{_detail(resp)}")
        return resp.json()

    def job_status(self) -> str:
        """The job's current membership status (`running`, `waiting`, ...), one request."""
        resp = self._call(self._client, "GET", "/membership")
        if resp.status_code != 200:
            raise MembershipError(f"membership of the job refused ({resp.status_code}): {_detail(resp)}")
        return str(resp.json()["status"])

    # -------------------------------------------------------------------------------- threads
    def start(self, after: int = 0) -> None:
        self._after = after
        threading.Thread(target=self._heartbeat_loop, name="heartbeat", daemon=True).start()
        threading.Thread(target=self._poll_loop, name="assignment-poll", daemon=True).start()

    def stop(self) -> None:
        self._stop.set()

    def _heartbeat_loop(self) -> None:
        client = self._new_client()
        p, s = self.worker
        while not self._stop.wait(self.interval_s):
            try:
                client.post(f"/workers/{p}/{s}/heartbeat")
            except httpx.TransportError:
                continue  # the poll thread decides when the service is lost

    def _poll_loop(self) -> None:
        client = self._new_client(read_s=POLL_WAIT_S + 10.0)
        p, s = self.worker
        last_ok = time.monotonic()
        while not self._stop.is_set():
            try:
                resp = client.get(f"/workers/{p}/{s}/assignment",
                                  params={"after": self._after, "wait_s": POLL_WAIT_S})
            except httpx.TransportError as exc:
                if time.monotonic() - last_ok > self.service_lost_s:
                    self.error = f"service unreachable for {self.service_lost_s:.0f} s: {exc}"
                    self.changed.set()
                    return
                time.sleep(0.2)
                continue
            last_ok = time.monotonic()
            if resp.status_code == 204:
                continue
            if resp.status_code != 200:
                self.error = f"assignment refused ({resp.status_code}): {_detail(resp)}"
                self.changed.set()
                return
            body = resp.json()
            with self._lock:
                if self.latest is None or body["generation"] > self.latest["generation"]:
                    self.latest = body
                    self._after = body["generation"]
            self.changed.set()

    def wait_newer(self, generation: int, timeout_s: float) -> dict[str, Any]:
        """The latest assignment once its generation is above `generation` (bounded)."""
        deadline = time.monotonic() + timeout_s
        while True:
            with self._lock:
                latest = self.latest
            if latest is not None and latest["generation"] > generation:
                return latest
            if self.error:
                raise MembershipError(self.error)
            if time.monotonic() > deadline:
                raise MembershipError(f"no generation after {generation} within {timeout_s:.0f} s")
            self.changed.wait(0.05)
            self.changed.clear()

    def adopt(self, generation: int) -> None:
        """The main loop now runs `generation`: `changed` fires again only for a newer one."""
        self._adopted = generation
        self.changed.clear()
        with self._lock:
            newer = self.latest is not None and self.latest["generation"] > generation
        if newer or self.error:
            self.changed.set()
