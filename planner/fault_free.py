"""The fault-free plan of a job: computed once, deterministically, and shared.

Every failure class of a job reports the same `fault_free_iteration_ms`, in every process, so the
fault-free plan must not depend on the caller's time limit, on whether CP-SAT is enabled for the
failure plans, or on the machine's load. It is made on one pipeline (all D pipelines of a
fault-free job are identical, and the stage all-reduces of identical pipelines start together, so D
copies of one pipeline's plan have that pipeline's period) by:
1. the constructive search (`best_heuristic`) over its whole policy grid with no wall-time budget
   (no randomness, no clock);
2. opt-in (`RECYCLE_FAULT_FREE_CP_S` > 0; off by default): when that misses the analytic bound and
   the pipeline has at most `cpsat.FULL_MAX_OPS` ops, CP-SAT warm-started from it with a fixed
   *deterministic* budget: one search worker, seed 0, `max_deterministic_time =
   CP_DETERMINISTIC_S`, within a wall cap of `CP_WALL_CAP_S`; when the cap is hit CP-SAT's answer
   is discarded, so the plan is the deterministic one of step 1 and the swaps, cached like any
   other. It is off by default because no budget makes it both bounded and machine-independent:
   CP-SAT's wall per deterministic unit varies more than tenfold with the model (2 units took
   7.4-9.8 s on the made-up 1 x 4 x 20, 52 s on a 1 x 2 x 13 whose memory holds one micro-batch;
   0.5 units still passed 10 s on four of the eight jobs of benchmarks/jobs/fault-free-slow-cp.jsonl
   and took 8 s on a 1 x 7 x 8), so any cap makes some jobs' plans depend on the machine and its
   load (the 1 x 4 x 20 came out 509.72 or 509.78 ms run to run). What it bought on the 56 made-up
   jobs of seeds 0-5 after the swaps: 6 plans shorter by 0.01-0.25%; the scenario plans and the
   Zero Bubble comparison are the same without it.
   Between steps 1 and 2, when the heuristic misses the bound: adjacent swaps of each worker's F/B
   order (`planner.order_search`), seed 0, at most `SWAPS` of them and `SWAP_OP_BUDGET` swaps x
   ops (a count, not a clock, so no cap is needed). On the made-up 1 x 5 x 10 of
   docs/notes/planner-issue8.md (R) they reach CP-SAT's proven optimum 255.6 ms from the list
   schedule's 262.4 in ~1.4 s, where more deterministic time for CP-SAT alone did not reliably.
`CP_DETERMINISTIC_S` comes from `RECYCLE_FAULT_FREE_CP_S` (default 0: no step 2; 2.0 was the
default before v8), `SWAPS` from `RECYCLE_FAULT_FREE_SWAPS` (default 600; 0 disables the swaps);
both are part of `method`, which every plan records.

Cache: in-process by the job's canonical hash (the spec with defaults filled, pipelines set to 1,
keys sorted); optionally on disk as `<dir>/<hash>.json` when `RECYCLE_FAULT_FREE_CACHE` names a
directory (read first, written atomically after a solve). The file carries `method` so a cache
written by a different method is ignored.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import threading
from dataclasses import dataclass
from pathlib import Path

from planner.spec import JobSpec
from planner.timeline import Op

CACHE_ENV = "RECYCLE_FAULT_FREE_CACHE"


def _env_number(name: str, default: str, kind: type) -> float | int:
    """A non-negative number from the environment, or an error that names the variable."""
    text = os.environ.get(name, default)
    try:
        value = kind(text)
    except ValueError:
        value = -1
    if not value >= 0:
        raise ValueError(f"{name} must be a {kind.__name__} >= 0, got {text!r}")
    return value


CP_ENV = "RECYCLE_FAULT_FREE_CP_S"
CP_DETERMINISTIC_S = _env_number(CP_ENV, "0", float)
CP_WALL_CAP_S = 10.0
"""Wall seconds the opt-in CP-SAT step may take (module docstring, 2.): a first plan also makes the
job's fault-free plan (the grid, up to ~6 s on the made-up jobs, the swaps, ~2.3 s at most, and
this step), and a CLI user waits for all of it."""
CP_SEED = 0
SWAPS_ENV = "RECYCLE_FAULT_FREE_SWAPS"
SWAPS = _env_number(SWAPS_ENV, "600", int)
SWAP_OP_BUDGET = 150_000
"""Swaps x ops of the pipeline at most (a swap's sweep and replay cost ~15 us per op): 600 swaps
up to 250 ops, 260 on 1 x 8 x 24, 52 at `cpsat.FULL_MAX_OPS`; ~2.3 s at most on this machine."""


def method() -> str:
    """Recorded with each fault-free plan; part of the disk cache's validity check. The suffix is
    bumped whenever the search itself changes (v3: the schedulers release activation_mb -
    activation_w_mb at B end, so a v2 plan of a job with activation_w_mb < activation_mb differs;
    v4: Zero Bubble's greedy and deep-warm-up sweeps join the fault-free candidates; v5: the greedy's
    per-stage warm-up overrun rule, `zb_greedy.overrun_threshold`; v6: stage 0's first forwards
    spaced where memory paces it, `Policy.first_stage_spacing`, and the order swaps; v7: CP-SAT's
    answer discarded when its wall cap is hit, and the cap 10 s instead of 60; v8: no CP-SAT step
    unless asked for, and the grid skips rotations that route like rotation 0; v9: the grid's first
    policies re-run with stage 0 or the bottleneck stage paced where memory is short, as under
    failures, `candidates.memory_short_stages`)."""
    cp = (f"cp-sat(workers=1,seed={CP_SEED},max_deterministic_time={CP_DETERMINISTIC_S:g},"
          f"wall_cap={CP_WALL_CAP_S:g}s)"
          if CP_DETERMINISTIC_S > 0 else "no-cp")
    swaps = f"+order-swaps({SWAPS},ops-budget={SWAP_OP_BUDGET},seed=0)" if SWAPS > 0 else ""
    return f"heuristic(full-grid,no-time-budget){swaps}+{cp}/v9"


@dataclass(frozen=True)
class FaultFreePlan:
    """One pipeline's fault-free plan (pipeline index 0) and its replayed period."""

    key: str
    ops: tuple[Op, ...]
    iteration_ms: float
    policy: str
    method: str
    settled: bool = True
    cacheable: bool = True


_memory: dict[tuple[str, str], FaultFreePlan] = {}
_lock = threading.Lock()


def single_pipeline(job: JobSpec) -> JobSpec:
    """The job with one pipeline and every default made explicit (so equal jobs hash equally)."""
    return JobSpec.model_validate({**job.filled(), "pipelines": 1})


def canonical_hash(job: JobSpec) -> str:
    """sha256 of the single-pipeline job's canonical JSON (defaults filled, keys sorted)."""
    text = json.dumps(single_pipeline(job).filled(), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()


def fault_free_plan(job: JobSpec, cache_dir: str | os.PathLike | None = None,
                    wall_cap_s: float | None = None) -> FaultFreePlan:
    """The job's fault-free plan (one pipeline), from the cache or solved once. `wall_cap_s` caps
    the CP-SAT step's wall time below `CP_WALL_CAP_S` (a solve with a time limit asking for the
    dropped job's plan, a candidate: it keeps the best plan the capped step found); a plan made
    when a cap was hit is kept in no cache, so the deterministic plan is still what a caller with
    time gets. Without `wall_cap_s` (the job's own plan) a capped step's answer is discarded and
    the plan without it is cached."""
    key = canonical_hash(job)
    with _lock:
        hit = _memory.get((key, method()))
    if hit is not None:
        return hit
    folder = cache_dir if cache_dir is not None else os.environ.get(CACHE_ENV) or None
    found = _read(Path(folder) / f"{key}.json", key) if folder else None
    if found is None:
        found = _solve(job, key, CP_WALL_CAP_S if wall_cap_s is None else min(CP_WALL_CAP_S, wall_cap_s),
                       keep_capped=wall_cap_s is not None)
        if not found.cacheable:
            return found
        if folder:
            _write(Path(folder), found)
    with _lock:
        return _memory.setdefault((key, method()), found)


def _solve(job: JobSpec, key: str, wall_cap_s: float, keep_capped: bool) -> FaultFreePlan:
    from planner.bounds import lower_bound
    from planner.candidates import SearchInfo, best_heuristic

    single = single_pipeline(job)
    info = SearchInfo()
    bound = lower_bound(single, ()).value_ms
    ops, period, policy = best_heuristic(single, (), bound, budget_s=float("inf"), info=info)
    cacheable = True
    swaps = min(SWAPS, SWAP_OP_BUDGET // max(1, single.op_count))
    if swaps > 0 and period > bound + 1e-6 and info.settled:
        # Before CP-SAT and with no wall cap: a count of swaps is the same work on any machine, so
        # a dropped job's plan made inside a solve's budget (capped) and the same plan made on its
        # own differ at most by CP-SAT's step, as before the swaps.
        from planner.order_search import search_orders

        found = search_orders(single, (), list(ops), period, bound, swaps, seed=0)
        if found is not None:
            ops, period = found.ops, found.period_ms
            policy = f"{policy}+swaps({found.accepted}/{found.evaluations})"
    if CP_DETERMINISTIC_S > 0 and period > bound + 1e-6:
        from planner.cp import cpsat
        from planner.simulator import replay

        if single.op_count <= cpsat.FULL_MAX_OPS:
            result = cpsat.improve(single, (), ops, period, bound, wall_cap_s, CP_SEED,
                                   deterministic_time=CP_DETERMINISTIC_S)
            capped = result.parameters.get("wall_cap_hit", False)
            # A capped step's answer depends on the machine and its load: the job's own plan stays
            # the grid-and-swaps one (cached like any other: the same plan wherever the cap binds,
            # and no re-solve per call); a caller's candidate within its budget takes what was
            # found and is cached nowhere.
            cacheable = not (capped and keep_capped)
            if result.ops is not None and (not capped or keep_capped):
                report = replay(single, result.ops)
                if report.converged and report.iteration_ms < period - 1e-6:
                    ops, period = result.ops, report.iteration_ms
                    policy = f"{policy}+cp-sat({result.cp_status})"
                    info.settled = True
    return FaultFreePlan(key, tuple(ops), period, policy, method(), info.settled, cacheable)


def _read(path: Path, key: str) -> FaultFreePlan | None:
    """The cached plan, or None when the file is missing, unreadable, of another job or method, or
    not what `_write` writes (a file edited or written by something else costs a re-solve, never a
    traceback)."""
    try:
        data = json.loads(path.read_text())
        if data.get("key") != key or data.get("method") != method():
            return None
        ops = tuple(Op((0, int(o[0])), str(o[1]), None if o[2] is None else (0, int(o[2])), float(o[3]),
                       float(o[4])) for o in data["ops"])
        return FaultFreePlan(key, ops, float(data["iteration_ms"]), str(data["policy"]), data["method"],
                             bool(data["settled"]))
    except (OSError, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None


def _write(folder: Path, plan: FaultFreePlan) -> None:
    data = {"key": plan.key, "method": plan.method, "iteration_ms": plan.iteration_ms,
            "policy": plan.policy, "settled": plan.settled,
            "ops": [[o.worker[1], o.kind, None if o.microbatch is None else o.microbatch[1],
                     o.start_ms, o.end_ms] for o in plan.ops]}
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile("w", dir=folder, delete=False, suffix=".tmp") as f:
            json.dump(data, f)
        os.replace(f.name, folder / f"{plan.key}.json")
    except OSError:
        pass  # the disk cache is optional: a read-only or full disk only costs a re-solve


def replicate(job: JobSpec, single_ops) -> list[Op]:
    """One pipeline's plan copied onto each of the job's D pipelines."""
    return [
        Op((p, op.worker[1]), op.kind, None if op.microbatch is None else (p, op.microbatch[1]),
           op.start_ms, op.end_ms)
        for p in range(job.pipelines)
        for op in single_ops
    ]


def clear_memory_cache() -> None:
    """Forget in-process fault-free plans (tests use it to force a disk read or a re-solve)."""
    with _lock:
        _memory.clear()
