"""What benchmarks/api_abuse.py reads back: the database after the run, the moment the service
declared the failure, and the server's resident memory."""

from __future__ import annotations

import json
from pathlib import Path

from abuse_traffic import Tally
from sqlalchemy import create_engine, text


def check_store(db_url: str, job_id: str, tally: Tally, generation: int) -> dict:
    """Compare the stored jobs, keys, membership and plans with what the answers said."""
    engine = create_engine(db_url)
    try:
        with engine.connect() as conn:
            stored = [r[0] for r in conn.execute(text("SELECT id FROM jobs"))]
            keys = dict(conn.execute(text("SELECT key, job_id FROM idempotency_keys")).all())
            member = conn.execute(text("SELECT generation, failed, plan_id, status FROM memberships "
                                       "WHERE job_id = :j"), {"j": job_id}).one()
            plans = {r[0]: r[1] for r in conn.execute(text(
                "SELECT p.id, s.status FROM plans p JOIN solves s ON s.job_id = p.job_id AND "
                "s.class_key = p.class_key WHERE p.job_id = :j"), {"j": job_id})}
            solve = conn.execute(text(
                "SELECT s.created_at, s.solved_at, s.summary FROM plans p JOIN solves s ON s.job_id = "
                "p.job_id AND s.class_key = p.class_key WHERE p.id = :p"), {"p": member.plan_id}).first()
            unexplained_keys = dict(conn.execute(text("SELECT job_id, key FROM idempotency_keys")).all())
            first = conn.execute(text("SELECT s.status FROM plans p JOIN solves s ON s.job_id = p.job_id "
                                      "AND s.class_key = p.class_key WHERE p.job_id = :j AND "
                                      "p.failed_key = 'none'"), {"j": job_id}).scalar()
    finally:
        engine.dispose()
    alive = tally.created - tally.deleted
    ids = set(stored)
    duplicated = len(stored) - len(ids)  # a primary key: never, unless the schema lost it
    for key, answered in tally.keyed.items():
        if len(answered) > 1:
            duplicated += 1  # one key, two jobs
        elif answered <= alive and keys.get(key) != next(iter(answered)):
            duplicated += 1  # the stored key points elsewhere (or is gone) while its job lives
    gen_ok = member.generation == generation
    plan_state = plans.get(member.plan_id)
    reasons = []
    if plan_state != "done":
        reasons.append(f"generation {member.generation}'s plan {member.plan_id}: {plan_state}")
    if first != "done":
        reasons.append(f"generation 1's plan: {first}")
    if member.status != "running":
        reasons.append(f"status {member.status}")
    unexplained = ids - tally.created
    # A job no answer named but stored under a key whose answered job was deleted: a create with
    # that key processed after the delete (a dropped request's late twin).
    after_delete = sum(1 for j in unexplained if unexplained_keys.get(j) in tally.keyed
                       and tally.keyed[unexplained_keys[j]] <= tally.deleted)
    return {"lost": len(alive - ids), "duplicated": duplicated, "resurrected": len(tally.deleted & ids),
            "unexplained": len(unexplained), "unexplained_keyed_after_delete": after_delete,
            "unexplained_ids": sorted(unexplained),
            "solve_s": None if solve is None or solve.solved_at is None else round(
                solve.solved_at - solve.created_at, 3),
            "solver": None if solve is None or solve.summary is None else json.loads(solve.summary),
            "generation": member.generation if gen_ok else
            f"{member.generation} (expected {generation})", "failed": json.loads(member.failed),
            "plans": "yes" if not reasons else "no: " + "; ".join(reasons),
            "plan_id": member.plan_id, "jobs_stored": len(ids), "jobs_created": len(tally.created),
            "jobs_deleted": len(tally.deleted),
            "keys": len(tally.keyed)}


def declared_at(log: Path, job_id: str, generation: int, first_seen: dict[int, float]) -> float | None:
    """When the coordinator moved the job to `generation`: its log line (written as the change is
    published) or the first membership poll that saw it, whichever is earlier."""
    times = [first_seen[generation]] if generation in first_seen else []
    for line in log.read_text().splitlines():
        try:
            rec = json.loads(line)
        except ValueError:
            continue
        if rec.get("event") == "generation changed" and rec.get("job_id") == job_id \
                and rec.get("generation") == generation:
            times.append(float(rec["ts"]))
    return min(times) if times else None


def _rss_kb(pid: int) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def _children(pid: int) -> list[int]:
    out = []
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            out += [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            continue
    return out


def rss_mb(pid: int) -> tuple[float, float]:
    """The server process's resident memory, and with its solver processes added."""
    own = _rss_kb(pid)
    total, todo = own, _children(pid)
    while todo:
        child = todo.pop()
        total += _rss_kb(child)
        todo += _children(child)
    return own / 1024, total / 1024
