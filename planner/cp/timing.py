"""Milliseconds -> the integer time units of the CP model, and back.

The model is a RELAXATION of the real problem: every duration and hop is rounded DOWN to whole
units. Consequences (argued in docs/notes/cpsat.md):
- A bound proven on the model is a bound on the real problem (after the 1-unit correction in
  `bound_ms`), because every real plan maps to a model solution with a period of at most
  ceil(real period x scale) units.
- A model solution is never used by its times: only its per-worker op orders are kept and re-timed
  in exact milliseconds (`orders.retime`), which is valid by construction for any rounding.
When every number is a whole multiple of 1/scale the rounding is exact and nothing is lost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from planner.spec import JobSpec

SCALES = (100, 1000, 10_000, 100_000, 1_000_000)
"""At least 100 units per ms: a proven bound loses up to one unit (see `cpsat.global_bound_ms`)."""
FALLBACK_SCALE = 1000
MAX_UNITS = 2**50
"""Largest time value the model may need; CP-SAT works in int64 and wants head-room."""


@dataclass(frozen=True, slots=True)
class TimeScale:
    scale: int
    """Model units per millisecond."""
    exact: bool
    """Every duration and hop of the job is a whole number of units (no rounding at all)."""

    def down(self, ms: float) -> int:
        """ms -> units, rounded down (1e-6 absorbs float noise such as 0.615 * 1000 = 614.999...)."""
        return math.floor(ms * self.scale + 1e-6)

    def up(self, ms: float) -> int:
        return math.ceil(ms * self.scale - 1e-6)

    def ms(self, units: float) -> float:
        return units / self.scale


def job_times(job: JobSpec) -> list[float]:
    c = job.costs
    return [*c.forward, *c.backward_input, *c.backward_weight, *c.p2p, *c.cross_p2p, *c.allreduce,
            *c.optimizer]


def choose_scale(job: JobSpec) -> TimeScale:
    """The smallest power of ten >= 100 that makes every time of the job a whole number of units.

    F, B and W must also last at least one unit (they are > 0 by the spec): a zero-length op would
    let the model tie it with its successor and blur the op order we read back. Without an exact
    scale (e.g. 1/3 ms) we fall back to 1000 units per ms (or finer if an op is shorter).
    """
    c = job.costs
    shortest = min(min(c.forward), min(c.backward_input), min(c.backward_weight))
    values = job_times(job)
    for scale in SCALES:
        if shortest * scale < 1 - 1e-9:
            continue
        if all(abs(v * scale - round(v * scale)) <= 1e-6 + 1e-12 * v * scale for v in values):
            return TimeScale(scale, exact=True)
    scale = FALLBACK_SCALE
    while shortest * scale < 1:
        scale *= 10
    return TimeScale(scale, exact=False)
