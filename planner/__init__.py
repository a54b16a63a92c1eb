"""recycle planner: bubble-filling pipeline schedules for any failure set.

Importing this package loads neither torch nor FastAPI nor OR-Tools (CP-SAT is imported only when a
solve reaches it), so the CLI and the service start fast.
"""

from planner.failures import CanonicalFailure, enumerate_failure_classes, normalize, parse_failure_set
from planner.spec import JobSpec, SpecError, Worker
from planner.timeline import Op, SolverStats, SolveStatus, Timeline

__all__ = [
    "CanonicalFailure",
    "JobSpec",
    "Op",
    "SolveStatus",
    "SolverStats",
    "SpecError",
    "Timeline",
    "Worker",
    "enumerate_failure_classes",
    "normalize",
    "parse_failure_set",
]
