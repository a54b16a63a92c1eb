"""The contract's six validity rules, checked on a plan's op times as written.

Independent of how a plan was made: the planner re-validates its own plans with it, and
`recycle simulate` applies it to timelines from any tool.
"""

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
    """All violations of the contract's six validity rules (empty when the plan is valid).

    A valid plan is recognised on arrays first (`_valid_on_arrays`: the same comparisons, ~5x
    faster at 100k ops); anything else goes through the per-op checks below, which name each
    violation."""
    dead = set(map(tuple, failed))
    if _valid_on_arrays(job, dead, ops):
        return []
    return per_op_violations(job, dead, ops)


def per_op_violations(job: JobSpec, dead: set, ops: Sequence[Op]) -> list[str]:
    """The six rules checked op by op, each violation named: what `validate` returns for a plan
    the array check did not show valid (and the reference the array check is tested against)."""
    costs = job.costs
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


# ------------------------------------------------------------------------ the same rules on arrays

_KIND_CODE = {"F": 0, "B": 1, "W": 2, "ALLREDUCE": 3, "OPTIMIZER": 4}
_NO_MB = (-1, -1)


def _valid_on_arrays(job: JobSpec, dead: set, ops: Sequence[Op]) -> bool:
    """True only when `validate`'s per-op checks would find nothing: each rule's comparison is the
    same float expression, evaluated with numpy (tests/planner/test_fast_equivalence.py checks
    each rule's verdict against the per-op check's, on valid and broken plans). False means "not
    shown valid here": the caller then runs the per-op checks, which find and name violations."""
    verdicts = _rules_on_arrays(job, dead, ops)
    return verdicts is not None and all(verdicts.values())


def _rules_on_arrays(job: JobSpec, dead: set, ops: Sequence[Op]) -> dict[str, bool] | None:
    """Per rule group, whether it holds: "1-2" (workers, micro-batches, coverage, durations), then
    when that holds "3", "4", "5", "6" too; None for ops the arrays cannot hold (unknown kinds...)."""
    import numpy as np

    try:
        return _arrays_check(job, dead, ops, np)
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def _arrays_check(job: JobSpec, dead: set, ops: Sequence[Op], np) -> dict[str, bool]:
    from operator import attrgetter, itemgetter

    costs = job.costs
    D, S, M = job.pipelines, job.stages, job.microbatches
    n = len(ops)
    if n == 0:
        return {"1-2": False}
    first, second = itemgetter(0), itemgetter(1)
    kind = np.fromiter(map(_KIND_CODE.__getitem__, map(attrgetter("kind"), ops)), np.int64, n)
    workers = list(map(attrgetter("worker"), ops))
    pipe = np.fromiter(map(first, workers), np.int64, n)
    stage = np.fromiter(map(second, workers), np.int64, n)
    raw_mbs = list(map(attrgetter("microbatch"), ops))
    has_mb = np.fromiter((mb is not None for mb in raw_mbs), bool, n)
    mbs = [_NO_MB if mb is None else mb for mb in raw_mbs]
    home = np.fromiter(map(first, mbs), np.int64, n)
    index = np.fromiter(map(second, mbs), np.int64, n)
    start = np.fromiter(map(attrgetter("start_ms"), ops), np.float64, n)
    end = np.fromiter(map(attrgetter("end_ms"), ops), np.float64, n)
    # Rule 1: known, alive workers; compute ops carry a known micro-batch, collectives none.
    if not ((pipe >= 0) & (pipe < D) & (stage >= 0) & (stage < S)).all():
        return {"1-2": False}
    worker = pipe * S + stage
    dead_mask = np.zeros(D * S, dtype=bool)
    for p, st in dead:
        if 0 <= p < D and 0 <= st < S:
            dead_mask[p * S + st] = True
    if dead_mask[worker].any():
        return {"1-2": False}
    compute = kind <= 2
    if (has_mb != compute).any():
        return {"1-2": False}
    if not ((home[compute] >= 0) & (home[compute] < D) & (index[compute] >= 0) & (index[compute] < M)).all():
        return {"1-2": False}
    # Rule 2: durations, as `abs((end - start) - expected) > EPS * max(1.0, expected)`.
    by_kind = np.array([[costs.duration(k, st) for st in range(S)] for k in _KIND_CODE], dtype=np.float64)
    expected = by_kind[kind, stage]
    if (np.abs((end - start) - expected) > EPS * np.maximum(1.0, expected)).any():
        return {"1-2": False}
    # Rule 1: every (micro-batch, stage) has exactly one F, B and W, all on one worker.
    DM = D * M
    idx = np.flatnonzero(compute)
    key = (kind[idx] * DM + home[idx] * M + index[idx]) * S + stage[idx]
    if idx.size != 3 * DM * S:
        return {"1-2": False}
    table = np.full(3 * DM * S, -1, dtype=np.int64)
    table[key] = idx
    if (table < 0).any():
        return {"1-2": False}  # a key twice (so another one missing)
    by_key = table.reshape(3, DM * S)
    if ((pipe[by_key[0]] != pipe[by_key[1]]) | (pipe[by_key[0]] != pipe[by_key[2]])).any():
        return {"1-2": False}
    # Rule 3, from the one precedence graph: `op.start + EPS < src.end + delay` nowhere.
    from planner.precedence import INPUTS

    verdicts = {"1-2": True, "3": True, "4": True, "5": True, "6": True}
    rule3 = needs(costs, S)
    for rule in INPUTS:
        code = _KIND_CODE[rule.kind]
        sel = np.flatnonzero((kind == code) & rule.applies(stage, S - 1))
        if not sel.size:
            continue
        src_stage = stage[sel] + rule.offset
        src = table[(_KIND_CODE[rule.source] * DM + home[sel] * M + index[sel]) * S + src_stage]
        same_ms = np.array([rule3[(rule.kind, st)].same_ms if (rule.kind, st) in rule3 else 0.0
                            for st in range(S)])
        cross_ms = np.array([rule3[(rule.kind, st)].cross_ms if (rule.kind, st) in rule3 else 0.0
                             for st in range(S)])
        at = stage[sel]
        delay = np.where(pipe[src] != pipe[sel], cross_ms[at], same_ms[at])
        if (start[sel] + EPS < end[src] + delay).any():
            verdicts["3"] = False
    # Rule 4: each worker's ops in `worker_orders` order never overlap.
    rank = np.array([0, 0, 0, 1, 2])[kind]
    order = np.lexsort((rank, end, start, stage, pipe))
    w_sorted = worker[order]
    same = w_sorted[1:] == w_sorted[:-1]
    if (start[order][1:][same] + EPS < end[order][:-1][same]).any():
        verdicts["4"] = False
    # Rule 5: one ALLREDUCE and one OPTIMIZER per alive worker, after every W of the stage, one
    # common ALLREDUCE start per stage, each OPTIMIZER after its ALLREDUCE.
    alive = ~dead_mask
    ar, opt = np.flatnonzero(kind == 3), np.flatnonzero(kind == 4)
    count_ar = np.bincount(worker[ar], minlength=D * S)
    count_opt = np.bincount(worker[opt], minlength=D * S)
    last_w = np.zeros(S)
    w_ops = np.flatnonzero(kind == 2)
    np.maximum.at(last_w, stage[w_ops], end[w_ops])
    ar_of = np.full(D * S, -1, dtype=np.int64)
    ar_of[worker[ar]] = ar
    if ((count_ar[alive] != 1).any() or (count_opt[alive] != 1).any()  # (then ar_of is complete)
            or (start[ar] + EPS < last_w[stage[ar]]).any()
            or (start[opt] + EPS < end[ar_of[worker[opt]]]).any()):
        verdicts["5"] = False
    else:
        for st in range(S):
            starts = start[ar[stage[ar] == st]]
            if starts.size and starts.max() - starts.min() > EPS:
                verdicts["5"] = False
    # Rule 6: `_memory_events` per worker, sorted as tuples (time, order, change), summed in order.
    act, act_w = np.array(costs.activation, dtype=np.float64), np.array(costs.activation_w, dtype=np.float64)
    ev_time = np.where(kind[idx] == 0, start[idx], end[idx])
    ev_order = (kind[idx] != 0).astype(np.int64) ^ 1
    st_c = stage[idx]
    change = np.where(kind[idx] == 0, act[st_c],
                      np.where(kind[idx] == 1, act_w[st_c] - act[st_c], -act_w[st_c]))
    ev_worker = worker[idx]
    ev = np.lexsort((change, ev_order, ev_time, ev_worker))
    ev_worker, change = ev_worker[ev], change[ev]
    cuts = np.flatnonzero(np.r_[True, ev_worker[1:] != ev_worker[:-1], True])
    limit = costs.memory_limit_mb + EPS
    for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
        if (np.cumsum(change[a:b]) > limit).any():
            verdicts["6"] = False
            break
    return verdicts
