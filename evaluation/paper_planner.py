"""Issue 8's paper-style planner: the ReCycle paper's (Gandhi et al., SOSP 2024) planning method as
a baseline for the planner.

Faithful to the paper, not crippled: the fault-free 1F1B order kept on every healthy worker with B
and W split and W's placed in bubbles, each failed worker's micro-batches dealt round-robin to its
alive same-stage peers (`planner.paper_style`, the same construction the planner tries as one of its
candidates), then CP-SAT warm-started from that schedule with the routing kept and the planner's
own default time limit given entirely to the solver (the planner itself spends part of it on its
heuristics). The solver is the planner's CP-SAT model (`planner.cp.cpsat.improve`) with
`fixed_routing=True`: the same rules, the same warm start, two search workers, and a plan kept only
when its replayed period is strictly better and the validator accepts it.

Both planners work on the failure set's canonical class (`planner.failures.normalize`): pipelines are
identical, so a relabelling changes no period, and the round-robin dealing is then the same in both.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from planner.bounds import lower_bound
from planner.failures import normalize
from planner.paper_style import paper_style_schedule
from planner.simulator import replay
from planner.solve import DEFAULT_TIME_LIMIT_S
from planner.spec import JobSpec, Worker
from planner.timeline import Op


@dataclass
class PaperPlan:
    failed: tuple[Worker, ...]
    """The canonical failure set the plan is for (`ops` refer to its pipelines)."""
    ops: list[Op]
    iteration_ms: float
    constructive_ms: float
    """The period of the 1F1B + round-robin construction before CP-SAT."""
    cp_status: str
    wall_s: float
    cp_model: str = ""
    """The CP-SAT model used: always the routing-fixed ('restricted') one."""


def paper_plan(job: JobSpec, failed, time_limit_s: float = DEFAULT_TIME_LIMIT_S, seed: int = 0) -> PaperPlan:
    """The paper-style plan for `job` with `failed` dead, within `time_limit_s` (construction
    included). Raises ValueError when the 1F1B construction does not exist (its warm-up does not
    fit the memory limit)."""
    from planner.cp import cpsat

    started = time.perf_counter()
    canonical = normalize(job, failed).failed
    ops = paper_style_schedule(job, canonical)
    if ops is None:
        raise ValueError("the 1F1B warm-up does not fit the memory limit")
    period = constructive = replay(job, ops).iteration_ms
    status, model = "not run", ""
    left = time_limit_s - (time.perf_counter() - started)
    if canonical and left > 0.5:
        bound = lower_bound(job, canonical).value_ms
        result = cpsat.improve(job, canonical, ops, period, bound, left, seed, fixed_routing=True)
        status, model = result.cp_status, result.model
        if result.ops is not None:  # strictly better, replayed and validated inside improve()
            ops, period = result.ops, result.period_ms
    return PaperPlan(canonical, ops, period, constructive, status, time.perf_counter() - started, model)
