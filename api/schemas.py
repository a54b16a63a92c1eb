"""Request and response bodies (they document the API in /openapi.json and /docs)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StrictFloat, StrictInt, StrictStr

from planner.instructions import InstructionStream


def _integral(value: Any) -> Any:
    """JSON has one number type: 4.0 is the integer 4 (as JSON Schema says). Only that is let
    through to the strict int check; "4", true and 4.5 are still refused."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


# Request fields are strict (no "4" -> 4, no true -> 1): a client bug surfaces as a 422 naming the
# field instead of a silently different request. JSON lists still read as tuples.
JsonInt = Annotated[StrictInt, BeforeValidator(_integral)]
WorkerRef = tuple[JsonInt, JsonInt]


class JobOut(BaseModel):
    id: str
    created_at: float
    spec: dict[str, Any] = Field(description="The job spec with defaults filled in.")
    workers: int = Field(description="pipelines x stages.")
    op_count: int = Field(description="F/B/W ops per iteration (3 x pipelines x stages x microbatches).")
    worker_token: str | None = Field(
        default=None, description="Bearer token for this job's worker processes: it allows only this "
        "job's coordinator routes. Null when the service runs without RECYCLE_API_TOKEN.")


class JobList(BaseModel):
    items: list[JobOut]
    total: int
    limit: int
    offset: int


class PlanRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    failed: list[WorkerRef] = Field(default_factory=list, max_length=65536,
                                    description="Failed workers as [pipeline, stage].")
    wait_s: StrictFloat = Field(default=10.0, ge=0, le=3600,
                          description="How long to wait for a solve before answering 202 (capped by the "
                          "service's RECYCLE_MAX_WAIT_S).")


class PlanSummary(BaseModel):
    id: str
    job_id: str
    failed: list[WorkerRef]
    failure_class: str = Field(description="The canonical failure class (shared by relabelled sets).")
    status: Literal["pending", "done", "failed"] = Field(
        description="pending: being solved (poll this resource); done: ready; failed: the planner refused.")
    iteration_ms: float | None = None
    fault_free_iteration_ms: float | None = None
    lower_bound_ms: float | None = None
    gap: float | None = Field(default=None, description="iteration_ms / lower_bound_ms - 1.")
    solver: dict[str, Any] | None = Field(default=None, description="Solver statistics of the solve.")
    error: str | None = None
    links: dict[str, str]


class PrecomputeRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_failures: JsonInt = Field(ge=0, le=64, description="Plan every failure class of up to k workers.")


class OperationOut(BaseModel):
    id: str
    job_id: str
    kind: Literal["precompute"]
    status: Literal["running", "done", "cancelled", "failed"]
    max_failures: int
    done: int = Field(description="Failure classes planned (including ones stored before this run).")
    total: int
    progress: float = Field(description="done / total.")
    eta_s: float | None = Field(default=None, description="Estimated seconds left (while running).")
    error: str | None = None
    created_at: float
    updated_at: float


class HeartbeatIn(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: StrictStr | None = Field(default=None, max_length=256,
                                      description="host:port where peers reach it.")
    pid: JsonInt | None = Field(default=None, ge=0, le=2**31 - 1)


_PORT = r"([1-9][0-9]{0,3}|[1-5][0-9]{4}|6[0-4][0-9]{3}|65[0-4][0-9]{2}|655[0-2][0-9]|6553[0-5])"
"""A TCP port, 1-65535, as the pattern says it (the OpenAPI document then says it too)."""


class Rendezvous(BaseModel):
    model_config = ConfigDict(extra="forbid")

    address: StrictStr = Field(max_length=256, pattern=r"^[^\s:]+(:[^\s:]+)*:" + _PORT + "$",
                               description="HOST:PORT of the c10d store the job's workers meet at.")


class WorkerReport(BaseModel):
    model_config = ConfigDict(extra="forbid")

    worker: WorkerRef = Field(description="The failed (or rejoining) worker [pipeline, stage].")
    reporter: WorkerRef | None = Field(default=None, description="Who reports it (must be part of the job).")
    reason: StrictStr | None = Field(default=None, max_length=2000)
    generation: JsonInt | None = Field(
        default=None, ge=1, le=2**31 - 1, description="The generation the reporter ran when it lost the "
        "worker. A failure report about an older generation than the job's is stale (its groups are "
        "gone already): answered, and ignored.")


class MembershipState(BaseModel):
    job_id: str
    generation: int
    status: Literal["solving", "running", "waiting", "stopped"] = Field(
        description="solving: the plan of this generation is being computed; running: workers run it; "
        "waiting: a stage lost every worker, the job waits for one to rejoin it and then every worker "
        "restores the newest checkpoint; stopped: no plan exists for this failure set.")
    reason: str | None
    failed: list[WorkerRef]
    plan_id: str | None
    iteration_ms: float | None
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    worker: WorkerRef | None = None
    excluded: bool | None = Field(default=None, description="True when `worker` is in the failure set.")
    registration: str | None = Field(
        default=None, description="Answered once, when a worker token's heartbeat registers this process: "
        "send it as X-Recycle-Registration on this worker's later calls.")


class RegisteredWorker(BaseModel):
    worker: WorkerRef
    address: str | None
    pid: int | None
    failed: bool
    seconds_since_heartbeat: float | None


class MembershipDetail(MembershipState):
    workers: list[RegisteredWorker]
    spec: dict[str, Any] = Field(description="The job spec with defaults filled in (what a worker process "
                                 "holding only the job's worker token needs to join).")


class Assignment(BaseModel):
    """What a worker runs in a generation. `instructions` is null unless status is `running`."""

    job_id: str
    generation: int
    status: Literal["running", "waiting", "stopped", "excluded"] = Field(
        description="running: run `instructions`; waiting: a stage lost every worker, keep polling until "
        "one rejoins it (then restore the newest checkpoint); stopped: no plan exists, stop cleanly; "
        "excluded: this worker is in the failure set, rejoin to come back.")
    reason: str | None
    plan_id: str | None
    failed: list[WorkerRef]
    worker: WorkerRef
    pipelines: int = Field(description="The job's pipelines (D).")
    stages: int = Field(description="The job's stages (S). This generation's alive workers are every "
                        "[p, s] with p < pipelines and s < stages that is not in `failed`: derive them "
                        "rather than expect a list (it would grow with the job, sent to every worker).")
    iteration_ms: float | None
    heartbeat_interval_s: float
    heartbeat_timeout_s: float
    instructions: InstructionStream | None


class Health(BaseModel):
    status: Literal["ok"]
    database: str
    schema_version: int
