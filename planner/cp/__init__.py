"""The CP-SAT side of the planner, split by concern (the entry point is `planner.cp.cpsat.improve`).

- `timing`: exact milliseconds <-> the model's integer time units.
- `orders`: per-worker op orders <-> exact-ms schedules (ASAP retiming, the hint's steady state,
  relabelling a plan into the symmetry-broken canonical form).
- `model`: the model itself, one function per constraint family.

Nothing here imports OR-Tools at package import time except `model`, which only `cpsat.improve`
imports when a solve actually runs.
"""
