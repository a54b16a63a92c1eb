"""The plan timeline (`recycle.timeline/v1`, the contract output) and the planner's result types.

Two representations on purpose: `Op` is the planner's own light record (a 32 x 16 x 64 plan has
~100k of them, and pydantic objects per op would dominate planning time); `Timeline` is the
validated pydantic model used to read timelines from outside and to document the API schema.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from planner.spec import Worker

TIMELINE_FORMAT = "recycle.timeline/v1"


class OpKind(StrEnum):
    F = "F"
    B = "B"
    W = "W"
    ALLREDUCE = "ALLREDUCE"
    OPTIMIZER = "OPTIMIZER"


COMPUTE_KINDS = ("F", "B", "W")
_KIND_RANK = {"F": 0, "B": 0, "W": 0, "ALLREDUCE": 1, "OPTIMIZER": 2}


@dataclass(slots=True)
class Op:
    """One scheduled op. `microbatch` is `(home pipeline, index)` for F/B/W, else None."""

    worker: Worker
    kind: str
    microbatch: tuple[int, int] | None
    start_ms: float
    end_ms: float

    @property
    def rerouted(self) -> bool:
        """Runs a micro-batch whose home pipeline is not this worker's (a failed worker's work)."""
        return self.microbatch is not None and self.microbatch[0] != self.worker[0]

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "worker": [self.worker[0], self.worker[1]],
            "kind": self.kind,
            "start_ms": round(self.start_ms, 6),
            "end_ms": round(self.end_ms, 6),
        }
        if self.microbatch is not None:
            out["microbatch"] = [self.microbatch[0], self.microbatch[1]]
        return out


def worker_orders(ops: Sequence[Op]) -> dict[Worker, list[Op]]:
    """Each worker's ops in execution order (by start, then end, compute before collectives)."""
    orders: dict[Worker, list[Op]] = defaultdict(list)
    for op in ops:
        orders[op.worker].append(op)
    for seq in orders.values():
        seq.sort(key=lambda o: (o.start_ms, o.end_ms, _KIND_RANK[o.kind]))
    return dict(orders)


Key = tuple[str, int, int, int]
"""A compute op by what it is, wherever it runs: (kind, home pipeline, micro-batch index, stage)."""
Orders = dict[Worker, list[Key]]
"""Each worker's compute ops in execution order: the form in which schedulers hand orders around
(the contract's period depends only on these orders)."""


def orders_of(ops: Sequence[Op]) -> Orders:
    """Each worker's compute ops in execution order (ALLREDUCE/OPTIMIZER are always last)."""
    return {
        w: [(o.kind, o.microbatch[0], o.microbatch[1], w[1]) for o in seq if o.kind in COMPUTE_KINDS]
        for w, seq in worker_orders(ops).items()
    }


class TimelineOp(BaseModel):
    """One op as the contract writes it on the wire (parsing and the API schema); the planner's
    own code uses `Op` (`Timeline.internal_ops`)."""

    model_config = ConfigDict(extra="allow")

    worker: tuple[int, int]
    kind: OpKind
    microbatch: tuple[int, int] | None = None
    start_ms: float
    end_ms: float


class Timeline(BaseModel):
    """A plan for one training iteration, per `shared/docs/contracts.md`."""

    model_config = ConfigDict(extra="allow")

    format: Literal["recycle.timeline/v1"] = TIMELINE_FORMAT
    job: dict[str, Any] = Field(description="The job spec, defaults filled in.")
    failed: list[tuple[int, int]] = Field(description="The failed workers [pipeline, stage].")
    iteration_ms: float = Field(description="Steady-state period of this plan.")
    fault_free_iteration_ms: float = Field(description="Period of the planner's fault-free plan.")
    lower_bound_ms: float = Field(description="Proven bound: no valid plan is faster.")
    ops: list[TimelineOp]

    def internal_ops(self) -> list[Op]:
        return [
            Op(
                worker=(o.worker[0], o.worker[1]),
                kind=o.kind.value,
                microbatch=None if o.microbatch is None else (o.microbatch[0], o.microbatch[1]),
                start_ms=o.start_ms,
                end_ms=o.end_ms,
            )
            for o in self.ops
        ]


class SolveStatus(StrEnum):
    """How good the returned plan is known to be."""

    OPTIMAL = "optimal"
    """Its period equals a proven lower bound."""
    IMPROVED = "improved"
    """CP-SAT found a better plan than the heuristic, optimality not proven."""
    HEURISTIC = "heuristic"
    """The heuristic's plan; CP-SAT did not run or found nothing better within its limit."""


@dataclass(slots=True)
class SolverStats:
    """What the solve did, recorded with every plan so a result can be explained and reproduced."""

    status: SolveStatus
    objective_ms: float
    """Period of the returned plan (same as the timeline's `iteration_ms`)."""
    bound_ms: float
    """Best proven lower bound on the period (analytic bound, or CP-SAT's when it proved more)."""
    heuristic_ms: float
    """Period of the best heuristic plan (CP-SAT's warm start)."""
    wall_s: float
    time_limit_s: float
    cp_status: str | None = None
    """Raw CP-SAT status name, or None when the model was not run."""
    cp_model: str | None = None
    """'full' or 'restricted (...)'; a restricted model's bound is not used as a global bound."""
    cp_wall_s: float = 0.0
    cp_workers: int = 0
    cp_seed: int = 0
    cp_branches: int = 0
    cp_conflicts: int = 0
    heuristic_policy: str = ""
    heuristic_budget_s: float = 0.0
    """Wall budget the constructive search had (`planner.solve.heuristic_budget_s`): past it the
    optional candidates are skipped and the routing search stops, so it is part of what makes
    the plan."""
    replay_settled: bool = True
    """False when the plan's replay did not reach a repeating steady state within its iterations:
    `objective_ms` is then an estimate (mean of the later iterations), never called optimal."""
    replay_cycle: int = 1
    """Iterations per repetition of the settled steady state (2: two lengths alternate, and the
    period is their mean); 0 when not settled."""
    fault_free_method: str = ""
    """How the shared fault-free plan was made (planner/fault_free.py: deterministic, no clock)."""
    lns: dict[str, Any] | None = None
    """The large-neighbourhood search (planner/cp/lns.py) when it ran: sub-models tried, accepted,
    improving, their CP-SAT statuses, wall time and the sub-solver parameters."""

    @property
    def gap(self) -> float:
        return self.objective_ms / self.bound_ms - 1.0 if self.bound_ms > 0 else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "status": self.status.value,
            "objective_ms": round(self.objective_ms, 6),
            "bound_ms": round(self.bound_ms, 6),
            "gap": round(self.gap, 6),
            "heuristic_ms": round(self.heuristic_ms, 6),
            "heuristic_policy": self.heuristic_policy,
            "wall_s": round(self.wall_s, 4),
            "time_limit_s": self.time_limit_s,
            "heuristic_budget_s": round(self.heuristic_budget_s, 4),
            "cp_status": self.cp_status,
            "cp_model": self.cp_model,
            "cp_wall_s": round(self.cp_wall_s, 4),
            "cp_workers": self.cp_workers,
            "cp_seed": self.cp_seed,
            "cp_branches": self.cp_branches,
            "cp_conflicts": self.cp_conflicts,
            "replay_settled": self.replay_settled,
            "replay_cycle": self.replay_cycle,
            "fault_free_method": self.fault_free_method,
            **({"lns": self.lns} if self.lns is not None else {}),
        }
