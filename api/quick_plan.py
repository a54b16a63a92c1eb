"""A coordinator's first plan for a failure set nobody precomputed (`planner.quick`: the full
search's first candidates, no search grid and no CP-SAT), so workers get a valid assignment in well
under a second at 8 x 64 (the full solve takes up to its 10 s time limit; the grid alone took 3.7 s
there). The full solve runs afterwards and replaces this plan when it is clearly better
(`api.coordination`).

Runs inside a solve process (`api.solve_worker`), never on the event loop.
"""

from __future__ import annotations

from typing import Any


def quick_class(job, canonical_failed: tuple) -> tuple[dict[str, Any], dict[str, Any]]:
    """Plan one canonical failure class quickly: (summary, timeline document). Raises what the
    planner raises (`SpecError` for a failure set that cannot be planned) or `ValueError` when no
    candidate gives a valid plan (then the caller waits for the full solve)."""
    from planner.quick import quick_plan

    timeline = quick_plan(job, canonical_failed).timeline_json()
    return timeline["solver"], timeline
