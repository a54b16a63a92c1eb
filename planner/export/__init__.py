"""Exports of a plan timeline (the contract dict), for people and other tools.

- `chrome.chrome_trace(timeline) -> dict`: Chrome trace / Perfetto JSON.
- `gantt.gantt_png(timeline, width_px) -> bytes`: a Gantt chart PNG (matplotlib, imported lazily).
- `pipelining_csv.pipelining_csv(timeline) -> str`: torch.distributed.pipelining compute-only CSV
  of a fault-free plan.

All take the `recycle.timeline/v1` dict, so they run the same on a fresh plan and on stored JSON.
"""

from planner.export.chrome import chrome_trace
from planner.export.gantt import gantt_png
from planner.export.pipelining_csv import pipelining_csv

__all__ = ["chrome_trace", "gantt_png", "pipelining_csv"]
