"""The abusers of benchmarks/api_abuse.py: raw-socket attacks, random API traffic and concurrent
job create / delete with Idempotency-Key retries. Each runs until `stop` is set and counts what the
server answered in `Tally` (a status code, or how the connection ended), so the run shows that every
attack met the limit meant for it (431, 413, 408, 401, ...) and that no request got a 500."""

from __future__ import annotations

import asyncio
import json
import random
import uuid
from collections import Counter
from dataclasses import dataclass, field

from api_common import Connection

CHUNK = b"a" * 65536


@dataclass
class Tally:
    outcomes: Counter = field(default_factory=Counter)
    """(abuser, status or how the connection ended) -> count."""
    keyed: dict[str, set[str]] = field(default_factory=dict)
    """Idempotency-Key -> every job id a 201 for it answered (one each, or a duplicate)."""
    created: set[str] = field(default_factory=set)
    """Every job id some POST /v1/jobs answered 201 for."""
    deleted: set[str] = field(default_factory=set)
    """Job ids a DELETE answered 204 for."""
    unknown_creates: int = 0
    """Creates without a key whose answer never came (the job may or may not exist)."""
    coordinated_writes_let_in: int = 0
    """Failure reports or rejoins on the coordinated job with bad credentials that got a 2xx."""

    tokens: dict[str, str] = field(default_factory=dict)
    """Worker token of every created job (random traffic uses them on those jobs)."""

    def count(self, who: str, outcome) -> None:
        self.outcomes[(who, outcome)] += 1

    def record_created(self, data: bytes) -> str:
        body = json.loads(data)
        self.created.add(body["id"])
        self.tokens[body["id"]] = body["worker_token"]
        return body["id"]

    def live_jobs(self) -> list[str]:
        return sorted(self.created - self.deleted)


@dataclass
class Target:
    host: str
    port: int
    admin: str
    job_id: str
    """The coordinated job: random traffic only reads it, and writes to it with bad credentials."""
    worker_token: str


async def _status(reader: asyncio.StreamReader, timeout_s: float) -> int | str:
    try:
        line = await asyncio.wait_for(reader.readline(), timeout_s)
    except TimeoutError:
        return "no answer"
    except ConnectionError:
        return "reset"
    parts = line.split()
    return int(parts[1]) if len(parts) > 1 and parts[1].isdigit() else "closed"


async def raw(t: Target, chunks, pause_s: float = 0.0, read_timeout_s: float = 45.0,
              half_close: bool = False) -> int | str:
    """Send `chunks` (lazily: a flood is never held in memory) while reading the answer: sending
    stops once the server answered or stopped reading; returns the answer's status."""
    try:
        reader, writer = await asyncio.open_connection(t.host, t.port)
    except OSError:
        return "refused"
    answer = asyncio.ensure_future(_status(reader, read_timeout_s))
    try:
        try:
            for chunk in chunks:
                if answer.done():
                    break
                writer.write(chunk)
                await writer.drain()
                if pause_s:
                    await asyncio.wait([answer], timeout=pause_s)
            if half_close and not answer.done():
                writer.write_eof()
        except ConnectionError:
            pass
        return await answer
    finally:
        answer.cancel()
        writer.close()


def _auth(t: Target, rng: random.Random) -> bytes:
    return rng.choice([b"", f"Authorization: Bearer {t.admin}\r\n".encode(),
                       b"Authorization: Bearer junk\r\n"])


async def header_floods(t: Target, tally: Tally, stop: asyncio.Event, seed: int) -> None:
    """One 16 MiB header, or 2,000 small header fields; the service must refuse both with 431."""
    rng = random.Random(seed)
    while not stop.is_set():
        if rng.random() < 0.5:
            def huge():
                yield b"GET /v1/jobs HTTP/1.1\r\nHost: t\r\n" + _auth(t, rng) + b"X-Flood: "
                for _ in range(256):
                    yield CHUNK
                yield b"\r\n\r\n"
            tally.count("header flood (16 MiB header)", await raw(t, huge()))
        else:
            fields = b"".join(b"X-F%d: %d\r\n" % (i, i) for i in range(2000))
            tally.count("header flood (2,000 fields)", await raw(
                t, [b"GET /v1/jobs HTTP/1.1\r\nHost: t\r\n" + _auth(t, rng) + fields + b"\r\n"]))


async def huge_bodies(t: Target, tally: Tally, stop: asyncio.Event, seed: int) -> None:
    """200 MB bodies, declared (Content-Length) or not (chunked): 413 before they are read."""
    rng = random.Random(seed)
    while not stop.is_set():
        head = b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n" + _auth(t, rng)
        if rng.random() < 0.5:
            def declared(head=head):
                yield head + b"Content-Length: 200000000\r\n\r\n"
                for _ in range(3052):
                    yield CHUNK
            tally.count("huge body (declared 200 MB)", await raw(t, declared()))
        else:
            def chunked(head=head):
                yield head + b"Transfer-Encoding: chunked\r\n\r\n"
                for _ in range(3052):
                    yield b"10000\r\n" + CHUNK + b"\r\n"
                yield b"0\r\n\r\n"
            tally.count("huge body (chunked 200 MB)", await raw(t, chunked()))


async def slow_clients(t: Target, tally: Tally, stop: asyncio.Event, seed: int, body: bool) -> None:
    """Slowloris: a head, or a body after a complete head, one line or byte a second, never done."""
    rng = random.Random(seed)
    await asyncio.sleep(rng.random() * 5)  # not all in step
    while not stop.is_set():
        if body:
            def trickle():
                yield (b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n"
                       + _auth(t, rng) + b"Content-Length: 4000\r\n\r\n{")
                while not stop.is_set():
                    yield b" "
            tally.count("slow body (1 byte/s)", await raw(t, trickle(), pause_s=1.0))
        else:
            def loris():
                yield b"GET /v1/jobs HTTP/1.1\r\nHost: t\r\n"
                for i in range(10_000):
                    if stop.is_set():
                        return
                    yield b"X-L%d: 1\r\n" % i
            tally.count("slow head (1 field/s)", await raw(t, loris(), pause_s=1.0))


async def half_open(t: Target, tally: Tally, stop: asyncio.Event, seed: int) -> None:
    """Connections that send nothing, or half a head and then close their sending side."""
    rng = random.Random(seed)
    await asyncio.sleep(rng.random() * 5)
    while not stop.is_set():
        if rng.random() < 0.5:
            tally.count("half-open (silent)", await raw(t, []))
        else:
            tally.count("half-open (half head, FIN)", await raw(
                t, [b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\n"], half_close=True))


def _spec(rng: random.Random) -> dict:
    return {"pipelines": rng.choice([2, 3, 4]), "stages": rng.choice([2, 3]), "microbatches": 4,
            "forward_ms": 1.0, "backward_input_ms": 1.0, "backward_weight_ms": 1.0,
            "p2p_ms": 0.1, "allreduce_ms": round(rng.uniform(1, 9), 3), "optimizer_ms": 1.0,
            "activation_mb": 1.0}


async def _send(conn: Connection | None, t: Target, method: str, path: str, body=None,
                headers: dict | None = None,
                timeout_s: float = 30.0) -> tuple[Connection | None, int | str, bytes]:
    """One request on a keep-alive connection, reopened when the previous answer closed it."""
    try:
        if conn is None:
            conn = await Connection(t.host, t.port).open()
        status, data = await asyncio.wait_for(conn.request(method, path, body, headers), timeout_s)
        return conn, status, data
    except (OSError, IndexError, ValueError, asyncio.IncompleteReadError, TimeoutError) as exc:
        if conn is not None:
            await conn.close()
        return None, type(exc).__name__, b""


async def creators(t: Target, tally: Tally, stop: asyncio.Event, seed: int) -> None:
    """Create jobs with an Idempotency-Key - retried after dropping the connection unread, or sent
    twice at once - and delete about half of them while another connection reads them."""
    rng = random.Random(seed)
    admin = {"Authorization": f"Bearer {t.admin}"}
    a = b = None
    while not stop.is_set():
        key, spec = f"abuse-{uuid.UUID(int=rng.getrandbits(128))}", _spec(rng)
        headers = {**admin, "Idempotency-Key": key}
        mode = rng.choice(["plain", "drop then retry", "twice at once"])
        answers = []
        if mode == "drop then retry":  # the request goes out, its answer is never read
            try:
                _, writer = await asyncio.open_connection(t.host, t.port)
                payload = json.dumps(spec).encode()
                writer.write(b"POST /v1/jobs HTTP/1.1\r\nHost: t\r\nAuthorization: Bearer %s\r\n"
                             b"Idempotency-Key: %s\r\nContent-Type: application/json\r\n"
                             b"Content-Length: %d\r\n\r\n%s"
                             % (t.admin.encode(), key.encode(), len(payload), payload))
                await writer.drain()
                await asyncio.sleep(rng.random() * 0.02)
                writer.close()
            except OSError:
                pass
        if mode == "twice at once":
            (a, s1, d1), (b, s2, d2) = await asyncio.gather(_send(a, t, "POST", "/v1/jobs", spec, headers),
                                                            _send(b, t, "POST", "/v1/jobs", spec, headers))
            answers = [(s1, d1), (s2, d2)]
        else:
            for _ in range(5):  # a retry after a dropped answer is what the key is for
                a, s1, d1 = await _send(a, t, "POST", "/v1/jobs", spec, headers)
                answers = [(s1, d1)]
                if isinstance(s1, int) and s1 != 503:
                    break
        for status, data in answers:
            tally.count(f"create with key ({mode})", status)
            if status == 201:
                job_id = tally.record_created(data)
                tally.keyed.setdefault(key, set()).add(job_id)
        ids = tally.keyed.get(key)
        if not ids:
            continue
        job_id = next(iter(ids))
        a, reused, _ = await _send(a, t, "POST", "/v1/jobs", {**spec, "microbatches": 8}, headers)
        tally.count("same key, other spec", reused)
        if rng.random() < 0.5:
            (a, gone, _), (b, read, _) = await asyncio.gather(
                _send(a, t, "DELETE", f"/v1/jobs/{job_id}", headers=admin),
                _send(b, t, "GET", f"/v1/jobs/{job_id}", headers=admin))
            tally.count("delete while read", gone)
            tally.count("read while deleted", read)
            if gone == 204:
                tally.deleted.add(job_id)
    for conn in (a, b):
        if conn is not None:
            await conn.close()
