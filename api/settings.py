"""Service settings, read from `RECYCLE_*` environment variables (pydantic-settings)."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

MIN_TOKEN_CHARS = 16


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="RECYCLE_", extra="ignore")

    database_url: str = Field(
        default="sqlite:///recycle.db",
        description="SQLAlchemy URL: sqlite:///FILE (embedded default) or postgresql+psycopg://...",
    )
    host: str = Field(default="127.0.0.1", description="Bind address; loopback unless told otherwise.")
    port: int = Field(default=8000, ge=0, le=65535)
    api_token: SecretStr | None = Field(
        default=None, description="When set, every route but /healthz needs `Authorization: Bearer`."
    )

    max_body_bytes: int = Field(default=1_048_576, ge=1024, description="Largest request body accepted.")
    max_header_bytes: int = Field(default=65_536, ge=1024, description="Largest request head (request line "
                                  "and headers) read; more answers 431 and closes the connection.")
    max_headers: int = Field(default=100, ge=8, description="Most header fields in one request (431 beyond).")
    header_timeout_s: float = Field(default=10.0, gt=0, description="A request head not complete this long "
                                    "after its first byte (or the connection opening) gets 408; closed.")
    body_timeout_s: float = Field(default=30.0, gt=0, description="A request body not complete this long "
                                  "after its head gets 408; closed.")
    max_plan_ops: int = Field(
        default=300_000, ge=1,
        description="Largest job accepted: 3 x pipelines x stages x microbatches F/B/W ops per plan.",
    )
    cache_entries: int = Field(
        default=4096, ge=1, description="Bound of each in-memory map (jobs, finished plans, coordinator "
        "state); the least recently used entries go (re-read from the store when needed).")
    max_precompute_classes: int = Field(default=20_000, ge=1, description="Most failure classes per run.")

    solve_time_limit_s: float = Field(default=10.0, gt=0, description="Planner time limit per solve.")
    solve_deadline_s: float | None = Field(
        default=None, gt=0, description="Most wall time one solve may take in all (its process is stopped "
        "and the plan marked failed); default 2 x RECYCLE_SOLVE_TIME_LIMIT_S + 30 s.")
    use_cp: bool = Field(default=True, description="Let the planner run CP-SAT after its heuristic.")
    fault_free_deadline_s: float = Field(
        default=300.0, gt=0, description="Most wall time the making of a job's fault-free plan may take "
        "(once per job, before its first solve; tens of seconds on a large pipeline with uneven "
        "stages). It is not counted in RECYCLE_SOLVE_DEADLINE_S.")
    fault_free_cache: str | None = Field(
        default=None, description="Directory where the solve processes share each job's fault-free plan "
        "(made once per job, deterministic; up to tens of seconds on a large job), across restarts too. "
        "The planner reads the same variable (RECYCLE_FAULT_FREE_CACHE). Default: a temporary "
        "directory for the service's lifetime, so its solve processes still share it (removed at "
        "shutdown, or by the next service to start if this one was killed).")
    solver_processes: int = Field(default=1, ge=1, description="Size of the solve process pool.")
    max_queued_solves: int = Field(
        default=64, ge=0, description="Client solves that may wait for a solve process; more answer 503.")
    max_wait_s: float = Field(default=60.0, gt=0, description="Longest a request may wait (plans, polls).")
    slice_answers: bool = Field(
        default=False, description="Write the long-poll answers a change wakes in slices, with the "
        "sockets read between them (api.turns): beats wait less during a large wake-up, but on a "
        "loaded box the wake-up measured longer (docs/benchmarks.md, 4,096 daemons).")

    beat_thread: bool = Field(
        default=True, description="Serve the keep-alive connections of registered workers' bodiless "
        "heartbeats on a thread of their own (api.beat_loop), so beats are not answered after "
        "whatever else the main event loop is doing (`recycle serve` only).")

    heartbeat_interval_s: float = Field(default=1.0, gt=0, description="How often workers should beat.")
    heartbeat_timeout_s: float = Field(
        default=5.0, gt=0, description="A registered worker silent this long is declared failed."
    )
    register_timeout_s: float = Field(
        default=60.0, gt=0, description="Once a job's first worker registered, a worker that has not "
        "registered this long after is declared failed (its peers get a re-plan instead of waiting).")

    log_level: str = Field(default="INFO")
    access_log: bool = Field(default=True, description="One structured log line per request.")

    @property
    def deadline_s(self) -> float:
        if self.solve_deadline_s is not None:
            return self.solve_deadline_s
        return 2 * self.solve_time_limit_s + 30

    def check(self) -> None:
        """Refuse settings that make the coordinator's timeouts contradict each other, and a token
        that would silently switch authentication off or be guessable."""
        if self.api_token is not None and len(self.api_token.get_secret_value().strip()) < MIN_TOKEN_CHARS:
            raise ValueError(
                f"RECYCLE_API_TOKEN: must be at least {MIN_TOKEN_CHARS} characters when set, not counting "
                "white space (an empty one would switch authentication off); unset it to run without "
                "authentication"
            )
        if self.deadline_s <= self.solve_time_limit_s:
            raise ValueError(
                f"RECYCLE_SOLVE_DEADLINE_S must exceed RECYCLE_SOLVE_TIME_LIMIT_S ({self.deadline_s} <= "
                f"{self.solve_time_limit_s}): every solve would be stopped before its time limit")
        if self.heartbeat_timeout_s <= self.heartbeat_interval_s:
            raise ValueError(
                "RECYCLE_HEARTBEAT_TIMEOUT_S must exceed RECYCLE_HEARTBEAT_INTERVAL_S "
                f"({self.heartbeat_timeout_s} <= {self.heartbeat_interval_s}): every worker would be "
                "declared failed between two beats"
            )
