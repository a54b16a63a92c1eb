"""What runs inside the solve process pool: the planner only (no FastAPI, no database).

The pool uses the spawn start method, so each worker imports this module fresh. A worker must not
outlive the service (kill -9 of the server leaves no orphan solving forever): on Linux it asks the
kernel for SIGKILL when its parent dies, and a watcher thread covers the rest.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any


def init_worker(parent_pid: int) -> None:
    if sys.platform.startswith("linux"):
        try:
            import ctypes

            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except OSError:
            pass

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def warm_up() -> bool:
    """Import the planner so the first real solve does not pay for it."""
    import planner.solve  # noqa: F401

    return True


def solve_class(job_json: str, failed: list[list[int]], time_limit_s: float, use_cp: bool,
                seed: int) -> tuple[dict[str, Any], str]:
    """Plan one canonical failure class; (summary, timeline JSON text).

    Raises `SpecError` for a failure set that cannot be planned, or `PlanInvalid` (a planner bug).
    """
    from planner.solve import plan
    from planner.spec import JobSpec

    job = JobSpec.model_validate_json(job_json)
    result = plan(job, [tuple(w) for w in failed], time_limit_s=time_limit_s, use_cp=use_cp, seed=seed)
    timeline = result.timeline_json()
    return timeline["solver"], json.dumps(timeline, separators=(",", ":"))
