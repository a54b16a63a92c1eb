"""The job spec (contract input) and the failure-set checks that depend on it.

The field names and meanings follow `shared/docs/contracts.md` exactly; fields may be added, never
renamed. Every `*_ms` field and `activation_mb` is a number or a list with one number per stage;
`StageCosts` resolves them once into per-stage tuples so the hot loops never re-check the union.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PerStage = float | list[float]
Worker = tuple[int, int]
"""A worker is `(pipeline, stage)`."""

_NON_NEGATIVE_FIELDS = (
    "p2p_ms",
    "cross_pipeline_p2p_ms",
    "allreduce_ms",
    "optimizer_ms",
    "activation_mb",
    "activation_w_mb",
)
_POSITIVE_FIELDS = ("forward_ms", "backward_input_ms", "backward_weight_ms")
MAX_MS = 1e7
"""Largest time any `*_ms` field may give (2.8 hours for one op). Plans are float milliseconds:
far larger values overflow the bounds' products (1e308 gave an infinite bound) and leave too few
digits for the other ops' durations (rule 2 failed at 1e10 beside 0.001 ms ops)."""
MAX_MB = 1e12
"""Largest `activation_mb`, `activation_w_mb` or `memory_limit_mb` (an exabyte), for the same reason."""


class SpecError(ValueError):
    """A job spec or failure set that cannot be planned; the message names the field or stage."""

    def __init__(self, message: str, field: str | None = None):
        super().__init__(message)
        self.field = field


class JobSpec(BaseModel):
    """A pipeline-parallel training job: D pipelines of S stages, M micro-batches per pipeline."""

    # Unknown fields are an error (contracts.md): a typo such as `memory_limit_mbb` must not
    # silently drop a limit.
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    pipelines: Annotated[int, Field(ge=1, le=65536, description="Data-parallel degree D.")]
    stages: Annotated[int, Field(ge=1, le=4096, description="Pipeline depth S.")]
    microbatches: Annotated[
        int, Field(ge=1, le=1_000_000, description="Micro-batches M per pipeline per iteration.")
    ]
    forward_ms: PerStage = Field(description="F: forward time of one micro-batch at a stage.")
    backward_input_ms: PerStage = Field(description="B: gradient w.r.t. the stage input.")
    backward_weight_ms: PerStage = Field(description="W: gradient w.r.t. the stage parameters.")
    p2p_ms: PerStage = Field(description="Transfer delay between adjacent stages, same pipeline.")
    cross_pipeline_p2p_ms: PerStage | None = Field(
        default=None, description="Transfer delay when sender and receiver sit in different pipelines."
    )
    allreduce_ms: PerStage = Field(description="The stage's data-parallel gradient all-reduce.")
    optimizer_ms: PerStage = Field(description="The stage's optimizer step.")
    activation_mb: PerStage = Field(description="Memory one micro-batch holds from its F start to its B end.")
    activation_w_mb: PerStage | None = Field(
        default=None, description="What it still holds from its B end to its W end (default activation_mb, "
        "at most activation_mb)."
    )
    memory_limit_mb: float | None = Field(
        default=None, description="Most memory any worker may hold at once (default S x max act)."
    )

    @model_validator(mode="after")
    def _check_per_stage(self) -> JobSpec:
        for name in _POSITIVE_FIELDS + _NON_NEGATIVE_FIELDS:
            value = getattr(self, name)
            if value is None:
                continue
            values = value if isinstance(value, list) else [value]
            if isinstance(value, list) and len(value) != self.stages:
                raise ValueError(
                    f"{name}: a per-stage list needs {self.stages} entries (one per stage), "
                    f"got {len(value)}"
                )
            for i, v in enumerate(values):
                where = f"{name}[{i}]" if isinstance(value, list) else name
                if not (v == v) or v in (float("inf"), float("-inf")):
                    raise ValueError(f"{where}: must be a finite number, got {v}")
                if name in _POSITIVE_FIELDS and v <= 0:
                    raise ValueError(f"{where}: must be > 0, got {v}")
                if v < 0:
                    raise ValueError(f"{where}: must be >= 0, got {v}")
                most, unit = (MAX_MB, "MB") if name.endswith("_mb") else (MAX_MS, "ms")
                if v > most:
                    raise ValueError(f"{where}: must be at most {most:g} {unit}, got {v:g}")
        if self.activation_w_mb is not None:
            full = _per_stage(self.activation_mb, self.stages)
            for i, (w, a) in enumerate(zip(_per_stage(self.activation_w_mb, self.stages), full, strict=True)):
                if w > a:
                    where = (f"activation_w_mb[{i}]" if isinstance(self.activation_w_mb, list)
                             else "activation_w_mb")
                    raise ValueError(f"{where}: must be at most activation_mb ({a}), got {w}")
        if self.memory_limit_mb is not None:
            limit = self.memory_limit_mb
            # 0 is a limit a job whose activations all take 0 MB meets (its filled-in default).
            if not (limit == limit) or limit in (float("inf"), float("-inf")) or limit < 0:
                raise ValueError(f"memory_limit_mb: must be a finite number >= 0, got {limit}")
            if limit > MAX_MB:
                raise ValueError(f"memory_limit_mb: must be at most {MAX_MB:g} MB, got {limit:g}")
            largest = max(_per_stage(self.activation_mb, self.stages))
            if limit < largest:
                raise ValueError(
                    f"memory_limit_mb: {limit} MB is below one micro-batch's activations "
                    f"({largest} MB), so no worker could run even one micro-batch"
                )
        return self

    @classmethod
    def parse(cls, data: Any) -> JobSpec:
        """Validate a job spec, raising `SpecError` that names the offending field."""
        if not isinstance(data, dict):
            raise SpecError("job spec: expected a JSON object", field=None)
        try:
            return cls.model_validate(data)
        except ValidationError as exc:
            first = exc.errors()[0]
            # Drop pydantic's union-member tags ("float", "list[float]") from the location.
            loc = [p for p in first["loc"] if not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS))]
            field = ".".join(str(p) for p in loc) or None
            msg = first["msg"].removeprefix("Value error, ")
            if first["type"] == "extra_forbidden":
                msg = "unknown field (the contract's job spec has no such field; check its spelling)"
            elif first["type"].endswith(("_type", "_parsing")):
                msg = f"{msg}, got {first['input']!r} (no conversion from strings or booleans)"
            raise SpecError(f"{field}: {msg}" if field and not msg.startswith(field) else msg,
                            field=field or _field_from_message(msg)) from None

    @cached_property
    def costs(self) -> StageCosts:
        """Per-stage numbers with defaults resolved."""
        return StageCosts.of(self)

    def filled(self) -> dict[str, Any]:
        """The spec as JSON with defaults filled in (as the timeline's `job` field carries it)."""
        data = self.model_dump(mode="json")
        if data.get("cross_pipeline_p2p_ms") is None:
            data["cross_pipeline_p2p_ms"] = data["p2p_ms"]
        if data.get("activation_w_mb") is None:
            data["activation_w_mb"] = data["activation_mb"]
        if data.get("memory_limit_mb") is None:
            data["memory_limit_mb"] = self.costs.memory_limit_mb
        return data

    @property
    def op_count(self) -> int:
        """F, B and W ops of one iteration (the size that drives planning cost)."""
        return 3 * self.pipelines * self.stages * self.microbatches

    def workers(self) -> list[Worker]:
        return [(p, s) for p in range(self.pipelines) for s in range(self.stages)]


_TYPE_TAGS = ("float", "int", "none", "list")


def _field_from_message(msg: str) -> str | None:
    head = msg.split(":", 1)[0]
    return head.split("[", 1)[0] if head and " " not in head else None


def _per_stage(value: PerStage | None, stages: int) -> tuple[float, ...]:
    if isinstance(value, list):
        return tuple(float(v) for v in value)
    return (float(value),) * stages


_DURATION_FIELD = {"F": "forward", "B": "backward_input", "W": "backward_weight",
                   "ALLREDUCE": "allreduce", "OPTIMIZER": "optimizer"}


@dataclass(frozen=True, slots=True)
class StageCosts:
    """Per-stage durations (ms) and memory (MB), resolved from a `JobSpec`."""

    forward: tuple[float, ...]
    backward_input: tuple[float, ...]
    backward_weight: tuple[float, ...]
    p2p: tuple[float, ...]
    cross_p2p: tuple[float, ...]
    allreduce: tuple[float, ...]
    optimizer: tuple[float, ...]
    activation: tuple[float, ...]
    """Held from a micro-batch's F start to its B end."""
    activation_w: tuple[float, ...]
    """Held from its B end to its W end (at most `activation`)."""
    memory_limit_mb: float

    @classmethod
    def of(cls, job: JobSpec) -> StageCosts:
        s = job.stages
        cross = job.cross_pipeline_p2p_ms if job.cross_pipeline_p2p_ms is not None else job.p2p_ms
        activation = _per_stage(job.activation_mb, s)
        limit = job.memory_limit_mb if job.memory_limit_mb is not None else s * max(activation)
        return cls(
            forward=_per_stage(job.forward_ms, s),
            backward_input=_per_stage(job.backward_input_ms, s),
            backward_weight=_per_stage(job.backward_weight_ms, s),
            p2p=_per_stage(job.p2p_ms, s),
            cross_p2p=_per_stage(cross, s),
            allreduce=_per_stage(job.allreduce_ms, s),
            optimizer=_per_stage(job.optimizer_ms, s),
            activation=activation,
            activation_w=(_per_stage(job.activation_w_mb, s) if job.activation_w_mb is not None
                          else activation),
            memory_limit_mb=float(limit),
        )

    def hop_ms(self, lower_stage: int, cross_pipeline: bool) -> float:
        """Delay of a transfer between `lower_stage` and `lower_stage + 1` (either direction).

        With per-stage lists the contract does not say whose entry a hop uses, so the planner takes
        the larger of the two stages' values: a plan valid under that reading is valid under either.
        """
        table = self.cross_p2p if cross_pipeline else self.p2p
        return max(table[lower_stage], table[lower_stage + 1])

    def fits(self, stage: int, cap: int) -> int:
        """How many stage-`stage` micro-batches a worker can hold at once (at most `cap`)."""
        act = self.activation[stage]
        # Compared as floats first: a tiny activation makes the quotient too large for int().
        fit = self.memory_limit_mb / act + 1e-9 if act > 0 else float("inf")
        return cap if fit >= cap else int(fit)

    def duration(self, kind: str, stage: int) -> float:
        return getattr(self, _DURATION_FIELD[kind])[stage]
