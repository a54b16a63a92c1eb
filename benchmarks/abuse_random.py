"""Random API traffic for benchmarks/api_abuse.py: valid and invalid requests to every route, with
the admin token, a worker token (of the job or of another), a wrong token or none.

The coordinated job is only read, or written with credentials that must be refused: a failure
report or rejoin on it that gets a 2xx counts as let in (the benchmark reports it). Every other
write goes to the jobs the abusers created."""

from __future__ import annotations

import json
import random
import string

from abuse_traffic import Tally, Target, _send, _spec

BAD_SPECS = [
    lambda s: {**s, "colour": "blue"},                      # an unknown field
    lambda s: {**s, "pipelines": "4"},                      # a number as a string
    lambda s: {**s, "stages": True},                        # a boolean as a number
    lambda s: {**s, "microbatches": -3},
    lambda s: {**s, "pipelines": 4096, "stages": 4096, "microbatches": 64},  # over the job size limit
    lambda s: {k: v for k, v in s.items() if k != "forward_ms"},
    lambda s: [s],
    lambda s: b'{"pipelines": 4, "stages": ',               # malformed JSON
]


def _word(rng: random.Random, n: int) -> str:
    return "".join(rng.choice(string.ascii_letters + string.digits + "-_") for _ in range(n))


def _worker(rng: random.Random) -> list:
    return rng.choice([[rng.randrange(4), rng.randrange(3)], [rng.randrange(4), 9], [-1, 0], ["0", 0], [0]])


def _request(rng: random.Random, t: Target, tally: Tally, ops: list[str]) -> tuple[str, str, object, str]:
    """(method, path, body, what): `what` names the request in the tally."""
    live = tally.live_jobs()
    own = rng.choice(live) if live and rng.random() < 0.9 else _word(rng, rng.choice([8, 32, 70]))
    base = f"/v1/jobs/{own}"
    w = _worker(rng)
    choices = [
        lambda: ("GET", f"/v1/jobs?limit={rng.choice([1, 10, 0, 5000])}&offset={rng.choice([0, 3, -1])}",
                 None, "list jobs"),
        lambda: ("GET", base, None, "get job"),
        lambda: ("POST", "/v1/jobs", _spec(rng), "create job"),
        lambda: ("POST", "/v1/jobs", rng.choice(BAD_SPECS)(_spec(rng)), "create bad job"),
        lambda: ("POST", f"{base}/plans", {"failed": [_worker(rng) for _ in range(rng.randrange(3))],
                                           "wait_s": rng.choice([0, 0.2, "1"])}, "plan"),
        lambda: ("GET", f"{base}/plans/{_word(rng, 32)}", None, "get plan"),
        lambda: ("POST", f"{base}/precompute", {"max_failures": rng.choice([0, 1, 65, -1, 1.5])},
                 "precompute"),
        lambda: (rng.choice(["GET", "DELETE"]),
                 f"/v1/operations/{rng.choice(ops) if ops else _word(rng, 32)}", None, "operation"),
        lambda: ("POST", f"{base}/workers/{w[0]}/{rng.randrange(3)}/heartbeat",
                 rng.choice([None, {"pid": rng.randrange(99999)}, {"address": "h:1", "x": 1}]), "heartbeat"),
        lambda: ("POST", f"{base}/failures", rng.choice([{"worker": w}, {"worker": w, "reporter": [0, 0]},
                                                         {"worker": w, "reason": "x" * 3000}]), "failure"),
        lambda: ("POST", f"{base}/rejoins", {"worker": w}, "rejoin"),
        lambda: ("GET", f"{base}/membership", None, "membership"),
        lambda: ("GET", f"{base}/workers/{w[0]}/1/assignment?after={rng.choice([0, 1, -5])}&wait_s=0", None,
                 "assignment"),
        lambda: ("PUT", f"{base}/rendezvous", {"address": rng.choice(["10.0.0.1:29400", "h:99999", "x"])},
                 "rendezvous"),
        lambda: ("GET", f"{base}/rendezvous", None, "rendezvous"),
        lambda: ("GET", f"/v1/jobs/{t.job_id}/membership", None, "coordinated: read"),
        lambda: ("GET", f"/v1/jobs/{t.job_id}/workers/{rng.randrange(4)}/{rng.randrange(4)}/assignment"
                 "?after=0&wait_s=0", None, "coordinated: read"),
        lambda: ("POST", f"/v1/jobs/{t.job_id}/" + rng.choice(["failures", "rejoins"]),
                 {"worker": [rng.randrange(4), rng.randrange(4)], "reporter": [0, 0]},
                 "coordinated: bad write"),
        lambda: ("POST", f"/v1/jobs/{t.job_id}/workers/0/0/heartbeat", None, "coordinated: bad write"),
        lambda: (rng.choice(["GET", "PATCH"]), rng.choice(["/healthz", "/metrics", "/openapi.json", "/nope",
                                                          "/v1/jobs/" + "x" * 300]), None, "misc"),
    ]
    return rng.choice(choices)()


def _headers(rng: random.Random, t: Target, tally: Tally, what: str, path: str) -> dict[str, str]:
    if what == "coordinated: bad write":
        others = [tok for j, tok in tally.tokens.items() if j != t.job_id]
        # The coordinated job's own worker token without its registration id is refused too (403).
        bad = ["junk", "rw1.x.y", *others[:1], t.worker_token]
        return {"Authorization": f"Bearer {rng.choice(bad)}"} if rng.random() < 0.8 else {}
    job = path.split("/")[3] if path.startswith("/v1/jobs/") else None
    options = [t.admin, t.admin, "junk", None, tally.tokens.get(job or "", "rw1.a.b"),
               rng.choice(list(tally.tokens.values()) or ["rw1.c.d"])]
    token = rng.choice(options)
    return {"Authorization": f"Bearer {token}"} if token else {}


async def random_traffic(t: Target, tally: Tally, stop, seed: int) -> None:
    rng = random.Random(seed)
    conn = None
    ops: list[str] = []
    while not stop.is_set():
        method, path, body, what = _request(rng, t, tally, ops)
        headers = _headers(rng, t, tally, what, path)
        conn, status, data = await _send(conn, t, method, path, body, headers)
        tally.count(f"random: {what}", status)
        if what == "coordinated: bad write" and isinstance(status, int) and 200 <= status < 300:
            tally.coordinated_writes_let_in += 1
        if what == "create job":
            if status == 201:
                tally.record_created(data)
            elif not isinstance(status, int) and headers.get("Authorization") == f"Bearer {t.admin}":
                tally.unknown_creates += 1
        if what == "precompute" and status == 202:
            ops.append(json.loads(data)["id"])
    if conn is not None:
        await conn.close()
