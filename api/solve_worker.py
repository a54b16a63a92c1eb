"""What runs inside the solve process pool: the planner only (no FastAPI, no database).

The pool uses the spawn start method, so each worker imports this module fresh. A worker must not
outlive the service (kill -9 of the server leaves no orphan solving forever): on Linux it asks the
kernel for SIGKILL when its parent dies, and a watcher thread covers the rest.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time
from typing import Any


def init_worker(parent_pid: int, niceness: int = 0, fault_free_cache: str | None = None) -> None:
    """`niceness`: how much lower than the server this process's CPU priority is (see
    `api.solver.FULL_SOLVE_NICENESS`). `fault_free_cache`: the directory where every solve process
    reads and writes jobs' fault-free plans (`planner.fault_free`), so a job's plan made by the
    warm-up in the quick process is not made again by each full-solve process."""
    if fault_free_cache is not None:
        from planner.fault_free import CACHE_ENV

        os.environ[CACHE_ENV] = fault_free_cache
    if niceness:
        with contextlib.suppress(OSError):
            os.nice(niceness)
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


def fault_free_cache() -> str | None:
    """The fault-free plan cache this process uses (tests read it through the pool)."""
    from planner.fault_free import CACHE_ENV

    return os.environ.get(CACHE_ENV)


def warm_up() -> bool:
    """Import the planner so the first real solve does not pay for it."""
    import planner.solve  # noqa: F401

    return True


class SolveFailed(Exception):  # noqa: N818 - the name says what happened to the solve
    """Whatever the planner raised, as one readable line. Only this crosses the process boundary:
    an exception is pickled as its `args`, so one whose `__init__` takes something else comes back
    garbled (`PlanInvalid(violations)` re-built from its message read `invalid plan: i; n; v; a; l`)
    and one that cannot be re-built at all (pydantic's `ValidationError`) breaks the pool."""

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message

    def __reduce__(self):
        return (SolveFailed, (self.message,))


def _as_solve_failed(exc: Exception) -> SolveFailed:
    """What the planner raised, as the one readable line that crosses the pool (`SolveFailed`)."""
    message = " ".join(str(exc).split())[:2000]
    return SolveFailed(f"{type(exc).__name__}: {message}")


def solve_class(job_json: str, failed: list[list[int]], time_limit_s: float, use_cp: bool,
                seed: int) -> tuple[dict[str, Any], str]:
    """Plan one canonical failure class; (summary, timeline JSON text).

    Raises `SolveFailed` with `Type: message` for anything the planner raises (a failure set that
    cannot be planned, `PlanInvalid` from a planner bug, running out of memory ...).
    """
    try:
        from planner.solve import plan
        from planner.spec import JobSpec

        job = JobSpec.model_validate_json(job_json)
        result = plan(job, [tuple(w) for w in failed], time_limit_s=time_limit_s, use_cp=use_cp, seed=seed)
        timeline = result.timeline_json()
        return timeline["solver"], json.dumps(timeline, separators=(",", ":"))
    except Exception as exc:
        raise _as_solve_failed(exc) from None


def quick_solve_class(job_json: str, failed: list[list[int]]) -> tuple[dict[str, Any], str]:
    """A coordinator's quick first plan of one canonical failure class (`api.quick_plan`), as
    `solve_class` returns a full one; raises `SolveFailed` the same way."""
    try:
        from api.quick_plan import quick_class
        from planner.spec import JobSpec

        job = JobSpec.model_validate_json(job_json)
        summary, timeline = quick_class(job, tuple(tuple(w) for w in failed))
        return summary, json.dumps(timeline, separators=(",", ":"))
    except Exception as exc:
        raise _as_solve_failed(exc) from None


def warm_job(job_json: str) -> bool:
    """Compute a job's fault-free plan in this process (kept in its memory and in the shared
    directory), so the job's first quick plan pays only for inserting the failed workers' work
    (1.46 -> 0.46 s at 8 x 64) and no solve pays for it inside its deadline. Raises `SolveFailed`
    the same way as `solve_class`."""
    try:
        from planner.fault_free import fault_free_plan
        from planner.spec import JobSpec

        fault_free_plan(JobSpec.model_validate_json(job_json))
        return True
    except Exception as exc:
        raise _as_solve_failed(exc) from None
