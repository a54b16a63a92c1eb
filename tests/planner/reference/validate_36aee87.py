"""FROZEN reference: planner/validate.py as of commit 36aee87 (per-op checks only, before the
array check of valid plans). Kept only for tests/planner/test_fast_equivalence.py; never edited."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from planner.precedence import BARRIER_SOURCE, data_edges, needs
from planner.spec import JobSpec, Worker
from planner.timeline import COMPUTE_KINDS, Op, worker_orders

EPS = 1e-6
"""Tolerance in ms (timelines carry 6 decimals)."""


class PlanInvalid(ValueError):
    """A plan that breaks the contract; `violations` lists every broken rule found."""

    def __init__(self, violations: list[str]):
        shown = "; ".join(violations[:5])
        more = f" (+{len(violations) - 5} more)" if len(violations) > 5 else ""
        super().__init__(f"invalid plan: {shown}{more}")
        self.violations = violations


# --------------------------------------------------------------------------------------- validation


def validate(job: JobSpec, failed: Sequence[Worker], ops: Sequence[Op]) -> list[str]:
    """All violations of the contract's six validity rules (empty when the plan is valid)."""
    costs = job.costs
    dead = set(map(tuple, failed))
    problems: list[str] = []
    where: dict[tuple[str, int, int, int], Op] = {}
    durations: dict[tuple[str, int], float] = {}  # costs.duration, looked up once per (kind, stage)

    for op in ops:
        p, s = op.worker
        if not (0 <= p < job.pipelines and 0 <= s < job.stages):
            problems.append(f"rule 1: op on unknown worker {list(op.worker)}")
            continue
        if op.worker in dead:
            problems.append(f"rule 1: {op.kind} runs on failed worker {list(op.worker)}")
        expected = durations.get((op.kind, s))
        if expected is None:
            expected = durations[(op.kind, s)] = costs.duration(op.kind, s)
        if abs((op.end_ms - op.start_ms) - expected) > EPS * max(1.0, expected):
            problems.append(
                f"rule 2: {op.kind} on {list(op.worker)} lasts {op.end_ms - op.start_ms:.6f} ms, "
                f"expected {expected}"
            )
        if op.kind not in COMPUTE_KINDS and op.microbatch is not None:
            problems.append(f"contract: {op.kind} on {list(op.worker)} carries a microbatch")
        if op.kind in COMPUTE_KINDS:
            if op.microbatch is None:
                problems.append(f"rule 1: {op.kind} on {list(op.worker)} has no microbatch")
                continue
            hp, m = op.microbatch
            if not (0 <= hp < job.pipelines and 0 <= m < job.microbatches):
                problems.append(f"rule 1: unknown microbatch {list(op.microbatch)}")
                continue
            key = (op.kind, hp, m, s)
            if key in where:
                problems.append(f"rule 1: two {op.kind} ops for microbatch [{hp}, {m}] at stage {s}")
            where[key] = op
    if problems:
        return problems

    problems += _check_coverage(job, dead, where)
    if problems:
        return problems
    problems += _check_order(job, where)
    problems += _check_one_at_a_time(ops)
    problems += _check_collectives(job, dead, ops, where)
    problems += _check_memory(job, ops)
    return problems


def _check_coverage(job, dead, where) -> list[str]:
    problems = []
    get = where.get
    for hp in range(job.pipelines):
        for m in range(job.microbatches):
            for s in range(job.stages):
                f, b, w = get(("F", hp, m, s)), get(("B", hp, m, s)), get(("W", hp, m, s))
                if f is not None and b is not None and w is not None and f.worker == b.worker == w.worker:
                    continue  # the common case, checked without building the lists below
                trio = [where.get((k, hp, m, s)) for k in COMPUTE_KINDS]
                if any(o is None for o in trio):
                    missing = [k for k, o in zip(COMPUTE_KINDS, trio, strict=True) if o is None]
                    problems.append(f"rule 1: microbatch [{hp}, {m}] stage {s} lacks {missing}")
                    continue
                workers = {o.worker for o in trio}
                if len(workers) != 1:
                    problems.append(f"rule 1: microbatch [{hp}, {m}] stage {s} split over {workers}")
                    continue
                # Any alive same-stage peer may serve it, home alive or not (contracts.md rule 1).
    return problems


def _check_order(job, where) -> list[str]:
    """Rule 3, edge by edge from the one precedence graph (planner/precedence.py)."""
    problems = []
    last = job.stages - 1
    for src, op, delay in data_edges(needs(job.costs, job.stages), where):
        if op.start_ms + EPS < src.end_ms + delay:
            hp, m = op.microbatch
            s = op.worker[1]
            if op.kind == "F":
                problems.append(f"rule 3: F of [{hp}, {m}] at stage {s} starts before its input arrives")
            elif op.kind == "W":
                problems.append(f"rule 3: W of [{hp}, {m}] at stage {s} starts before its B ends")
            elif s == last:
                problems.append(f"rule 3: B of [{hp}, {m}] on the last stage starts before its F ends")
            else:
                problems.append(f"rule 3: B of [{hp}, {m}] at stage {s} starts before its gradient arrives")
    return problems


def _check_one_at_a_time(ops) -> list[str]:
    problems = []
    for worker, seq in worker_orders(ops).items():
        for a, b in zip(seq, seq[1:], strict=False):
            if b.start_ms + EPS < a.end_ms:
                problems.append(f"rule 4: {a.kind} and {b.kind} overlap on {list(worker)}")
                break
    return problems


def _check_collectives(job, dead, ops, where) -> list[str]:
    problems = []
    by_worker: dict[Worker, dict[str, list[Op]]] = defaultdict(lambda: defaultdict(list))
    for op in ops:
        if op.kind in ("ALLREDUCE", "OPTIMIZER"):
            by_worker[op.worker][op.kind].append(op)
    last_w = defaultdict(float)  # per stage, when its last BARRIER_SOURCE op (W) ends
    for (kind, _, _, s), op in where.items():
        if kind == BARRIER_SOURCE:
            last_w[s] = max(last_w[s], op.end_ms)
    for s in range(job.stages):
        starts = []
        for p in range(job.pipelines):
            if (p, s) in dead:
                continue
            got = by_worker.get((p, s), {})
            ar, opt = got.get("ALLREDUCE", []), got.get("OPTIMIZER", [])
            if len(ar) != 1 or len(opt) != 1:
                problems.append(
                    f"rule 5: worker [{p}, {s}] has {len(ar)} ALLREDUCE and {len(opt)} OPTIMIZER ops"
                )
                continue
            starts.append(ar[0].start_ms)
            if ar[0].start_ms + EPS < last_w[s]:
                problems.append(f"rule 5: ALLREDUCE on [{p}, {s}] starts before every W of stage {s} ends")
            if opt[0].start_ms + EPS < ar[0].end_ms:
                problems.append(f"rule 5: OPTIMIZER on [{p}, {s}] starts before its ALLREDUCE ends")
        if starts and max(starts) - min(starts) > EPS:
            problems.append(f"rule 5: ALLREDUCE starts of stage {s} differ ({min(starts)} .. {max(starts)})")
    return problems


def _memory_events(job: JobSpec, ops: Sequence[Op]) -> dict[Worker, list[tuple[float, int, float]]]:
    """Per worker, (time, order, MB change): a micro-batch takes `activation_mb` at its F start,
    gives back all but `activation_w_mb` at its B end and the rest at its W end (rule 6). At equal
    times releases (order 0) sort before acquisitions (order 1)."""
    costs = job.costs
    events: dict[Worker, list[tuple[float, int, float]]] = defaultdict(list)
    for op in ops:
        stage = op.worker[1]
        act, act_w = costs.activation[stage], costs.activation_w[stage]
        if op.kind == "F":
            events[op.worker].append((op.start_ms, 1, act))
        elif op.kind == "B":
            events[op.worker].append((op.end_ms, 0, act_w - act))
        elif op.kind == "W":
            events[op.worker].append((op.end_ms, 0, -act_w))
    for evs in events.values():
        evs.sort()
    return events


def _check_memory(job, ops) -> list[str]:
    limit = job.costs.memory_limit_mb
    problems = []
    for worker, evs in _memory_events(job, ops).items():
        held = 0.0
        for _, _, delta in evs:
            held += delta
            if held > limit + EPS:
                problems.append(f"rule 6: worker {list(worker)} holds {held:g} MB > "
                                f"memory_limit_mb {limit:g}")
                break
    return problems


def peak_memory(job: JobSpec, ops: Sequence[Op]) -> dict[Worker, float]:
    """Peak activation memory held by each worker over the iteration (MB, rule 6's accounting)."""
    peaks = {}
    for worker, evs in _memory_events(job, ops).items():
        held = peak = 0.0
        for _, _, delta in evs:
            held += delta
            peak = max(peak, held)
        peaks[worker] = peak
    return peaks
