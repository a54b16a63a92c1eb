"""The coordinator's watchdog rules: which registered (or never registered) workers to declare
failed at a check, and the reason the new generation carries."""

from __future__ import annotations

from typing import TYPE_CHECKING

from api.settings import Settings
from planner.spec import Worker

if TYPE_CHECKING:
    from api.coordination import Membership


def confirm_s(s: Settings) -> float:
    """Long enough for a live worker's next beat even on a loaded machine, well under the heartbeat
    timeout that would catch a silent worker anyway."""
    return max(2 * s.heartbeat_interval_s, s.heartbeat_timeout_s / 2)


def lost_workers(m: Membership, s: Settings, now: float) -> tuple[set[Worker], str]:
    """Workers to declare failed now, and why: silent past the heartbeat timeout; reported by a
    peer and silent since; reported and, though beating, no new generation long after (too slow
    for its peers); or never registered while its peers did."""
    silent = {w for w, seen in m.last_seen.items()
              if now - seen > s.heartbeat_timeout_s and w not in m.failed}
    confirm = confirm_s(s)
    # A dead peer is found by the heartbeat timeout first (and its generation clears the reports).
    too_slow_s = 3 * s.heartbeat_timeout_s + confirm
    quiet = {w for w, at in m.suspects.items() if now - at > confirm and m.last_seen.get(w, 0) <= at}
    # Only reports made well into the generation: one just after a change is about the old groups.
    slow = {w for w, at in m.suspects.items()
            if now - at > too_slow_s and at - m.changed_at >= confirm} - quiet
    for w in [w for w in m.suspects if w in m.failed or w in quiet | slow]:
        del m.suspects[w]
    never: set[Worker] = set()
    if m.started_at is not None and not m.all_registered and now - m.started_at > s.register_timeout_s:
        job = m.job.job
        never = {(p, st) for p in range(job.pipelines) for st in range(job.stages)
                 if (p, st) not in m.last_seen and (p, st) not in m.failed}
        m.all_registered = not never
    parts = []
    for workers, why in ((silent, f"missed heartbeats for {s.heartbeat_timeout_s:g} s"),
                         (quiet - silent, f"reported by a peer and silent for {confirm:g} s since"),
                         (slow - silent, f"reported by a peer and, though beating, no new generation "
                                         f"{too_slow_s:g} s later (too slow for its peers; it may rejoin)"),
                         (never, f"never registered within {s.register_timeout_s:g} s of the first")):
        if workers:
            parts.append(f"{why}: {', '.join(str(list(w)) for w in sorted(workers))}")
    return silent | quiet | slow | never, "; ".join(parts)

