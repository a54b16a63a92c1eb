"""Bound 5 (docs/notes/bounds.md, section 6): round trips sharing the next stage's workers.

Where memory lets a worker of stage s and a worker of stage t = s + 1 each hold one micro-batch
between F start and B end (`holds` = 1 at both stages), a micro-batch m occupies its stage-s worker X
for a window J_m = [F_s start, B_s end] and its stage-t worker Y for a window I_m = [F_t start, B_t
end] inside it, with at least F_s + hop before and hop + B_s after. Windows of one worker are
disjoint. Bound 4 prices each worker alone; this prices the pairing:
- two windows of Y in a row from the same X are at least G = F_s + B_s + 2 hop apart (the X window
  of the first ends, the next one starts, on X, in between);
- a window of Y from another X between two windows of X on Y costs X idle: T (the stage-t window)
  and the W's Y must run before the next F fits in memory, against the G X needs anyway.
So a worker pair (p, s), (p, t) cannot both run at full speed while (p, t) also serves the round
trips of a stage-s worker cut from its own stage t. Per pipeline p with both workers alive, a =
micro-batches on both, b = on (p, s) only (sent to another pipeline), r = on (p, t) only, rho = runs
of own windows on (p, t); a period P must admit (a, b, r, rho) for every pair, and counts for the
cut and orphaned workers, adding up to D x M at both stages. The least such P is found by
bisection, each step a knapsack over the (identical) pairs.
"""

from __future__ import annotations

import json
import math

from planner.bounds import Bound, holds, pending_w_cap, stage_hops
from planner.spec import JobSpec, Worker

TOLERANCE_MS = 1e-9
"""Slack in every feasibility test, so rounding never makes a reachable period look infeasible."""
MAX_STATES = 20_000
"""Pairs x micro-batches x options above which the knapsack is not run (no bound from it): about
60 bisection steps of it must fit in a small part of a plan's time (16 x 2 x 64, 14 pairs: 3.2 s
at 100,000 on the loaded 2-core box; 8 x 2 x 24: 0.16 s)."""
_CACHE: dict[tuple, tuple[float, float]] = {}
"""(job, failed, stage) -> (largest period known infeasible, smallest known feasible); the search
asks lower_bound again for every routing it rules out, with other floors."""
_CACHE_SIZE = 256


def _most(limit: float, step: float, cap: int) -> int:
    """max{n in [0, cap] : n * step <= limit} (step > 0), -1 when limit < 0."""
    if limit < -TOLERANCE_MS:
        return -1
    return min(cap, int(math.floor((limit + TOLERANCE_MS) / step)))


class _StagePair:
    """The data of bound 5 for stages s and s + 1 (module docstring)."""

    def __init__(self, job: JobSpec, dead: set, s: int, hop: list[float]):
        costs = job.costs
        S, t = job.stages, s + 1
        f, b, w = costs.forward, costs.backward_input, costs.backward_weight
        self.total = job.pipelines * job.microbatches
        self.window_t = f[t] + b[t] + sum(f[u] + b[u] for u in range(t + 1, S)) + 2 * sum(hop[t:])
        own, cross = hop[s], min(costs.cross_p2p[s], costs.cross_p2p[t])
        self.j_own = f[s] + b[s] + self.window_t + 2 * own
        self.j_cross = f[s] + b[s] + self.window_t + 2 * cross
        self.gap = f[s] + b[s] + 2 * own
        q = pending_w_cap(costs, t, 1, self.total)
        between = max(self.window_t, f[t] + b[t] + max(0, 2 - q) * w[t])
        self.separation = max(0.0, between - self.gap)
        self.tail_s = w[s] + costs.allreduce[s] + costs.optimizer[s]
        self.tail_t = w[t] + costs.allreduce[t] + costs.optimizer[t]
        self.work_s, self.work_t = f[s] + b[s] + w[s], f[t] + b[t] + w[t]
        self.collective_s = costs.allreduce[s] + costs.optimizer[s]
        self.collective_t = costs.allreduce[t] + costs.optimizer[t]
        pipes = range(job.pipelines)
        self.pairs = sum(1 for p in pipes if (p, s) not in dead and (p, t) not in dead)
        self.cut = sum(1 for p in pipes if (p, s) not in dead and (p, t) in dead)
        self.orphan = sum(1 for p in pipes if (p, s) in dead and (p, t) not in dead)

    def _cross_only(self, period: float) -> int:
        """Most micro-batches a stage-s worker can serve with every one sent to another pipeline."""
        n = self.total
        return max(0, min(_most(period - self.tail_s, self.j_cross, n),
                          _most(period - self.collective_s, self.work_s, n)))

    def _received_only(self, period: float) -> int:
        """Most micro-batches a stage-t worker can serve with none of its own pipeline's stage s."""
        n = self.total
        return max(0, min(_most(period - self.tail_t, self.window_t, n),
                          _most(period - self.collective_t, self.work_t, n)))

    def options(self, period: float) -> list[tuple[int, int]]:
        """(most served at stage s, most served at stage t) of one pair at this period, over a and
        rho, the dominated ones left out."""
        n = self.total
        found = {(self._cross_only(period), self._received_only(period))}  # a = 0
        room_s = period - self.tail_s
        room_t = period - self.tail_t
        for a in range(1, n + 1):
            if (a * self.j_own > room_s + TOLERANCE_MS
                    or a * self.work_s + self.collective_s > period + TOLERANCE_MS):
                break
            for rho in range(1, a + 1):
                # Stage t: (a + r) T + (a - rho) G <= room_t and the work; r >= rho - 1.
                served_t = min(_most(room_t - (a - rho) * self.gap, self.window_t, n),
                               _most(period - self.collective_t, self.work_t, n))
                if served_t < a + rho - 1:
                    continue
                # Stage s: a J_own + b J_cross + max(0, rho - 1 - b) separation <= room_s and the
                # work; the largest b (any smaller b that also fits only lowers what is served).
                left = room_s - a * self.j_own
                cap = min(n - a, _most(period - self.collective_s, self.work_s, n) - a)
                most_b = -1
                for b in _b_candidates(left, rho, self.j_cross, self.separation, cap):
                    if b * self.j_cross + max(0, rho - 1 - b) * self.separation <= left + TOLERANCE_MS:
                        most_b = max(most_b, b)
                if most_b < 0:
                    continue
                found.add((a + most_b, served_t))
        return _pareto(found)

    def feasible(self, period: float) -> bool | None:
        """Whether a period admits counts for every worker (None: too large to decide)."""
        n = self.total
        if period < max(self.collective_s, self.collective_t) - TOLERANCE_MS:
            return False
        need_s = n - self.cut * self._cross_only(period)
        need_t = n - self.orphan * self._received_only(period)
        if self.pairs == 0:
            return need_s <= 0 and need_t <= 0
        most_own = min(n, int(max(0.0, period - self.tail_s) / self.j_own) + 1)
        if self.pairs * (n + 1) > MAX_STATES or most_own * (most_own + 1) // 2 > MAX_STATES:
            return None  # checked before the options are built: their count grows as most_own^2
        options = self.options(period)
        if self.pairs * (n + 1) * len(options) > MAX_STATES:
            return None
        # Knapsack over the pairs: most served at stage s for each total served at stage t (capped).
        best = [-1] * (n + 1)
        best[0] = 0
        for _ in range(self.pairs):
            nxt = [-1] * (n + 1)
            for served_t, served_s in enumerate(best):
                if served_s < 0:
                    continue
                for opt_s, opt_t in options:
                    k = min(n, served_t + opt_t)
                    v = min(n, served_s + opt_s)
                    if v > nxt[k]:
                        nxt[k] = v
            best = nxt
        return any(v >= need_s for k, v in enumerate(best) if k >= need_t and v >= 0)


def _b_candidates(left: float, rho: int, j_cross: float, separation: float, cap: int) -> list[int]:
    """The b worth testing for max{b : b J + max(0, rho - 1 - b) sep <= left} (convex in b, so
    the largest feasible b is the largest on one of the two linear pieces)."""
    out = [0]
    if j_cross > 0:
        # b >= rho - 1: b J <= left.
        top = int(math.floor((left + TOLERANCE_MS) / j_cross))
        out.append(min(cap, max(top, 0)))
        # b < rho - 1: b (J - sep) + (rho - 1) sep <= left.
        slope = j_cross - separation
        if slope > 0:
            most = int(math.floor((left - (rho - 1) * separation + TOLERANCE_MS) / slope))
            out.append(min(cap, rho - 2, most))
        else:
            out.append(min(cap, rho - 2))
    return [b for b in out if 0 <= b <= cap]


def _pareto(points: set[tuple[int, int]]) -> list[tuple[int, int]]:
    kept: list[tuple[int, int]] = []
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if not kept or y > kept[-1][1]:
            kept.append((x, y))
    return kept


def pair_bound(job: JobSpec, failed: tuple[Worker, ...] | list[Worker], floor_ms: float = 0.0) -> Bound:
    """Bound 5 over every pair of adjacent stages that both hold one micro-batch at a time; only
    computed above `floor_ms` (a bound already proven: when that period is feasible here, this
    bound adds nothing and one feasibility test is all it costs)."""
    costs = job.costs
    total = job.pipelines * job.microbatches
    dead = set(map(tuple, failed))
    hop = stage_hops(costs, job.stages)
    best = Bound(0.0, "")
    job_key = None
    for s in range(job.stages - 1):
        if holds(costs, s, total) != 1 or holds(costs, s + 1, total) != 1:
            continue
        if job_key is None:
            job_key = (json.dumps(job.filled(), sort_keys=True), tuple(sorted(dead)))
        pair = _StagePair(job, dead, s, hop)
        if pair.j_own <= 0 or pair.window_t <= 0 or pair.work_s <= 0 or pair.work_t <= 0:
            continue
        lo = max(floor_ms, best.value_ms)
        key = (job_key, s)
        known_lo, known_hi = _CACHE.get(key, (float("-inf"), float("inf")))
        if lo >= known_hi:
            continue  # feasible there already: nothing above lo from this pair of stages
        if known_lo < known_hi and _adjacent(known_lo, known_hi):
            if known_lo > lo:
                best = Bound(known_lo, _reason(pair, s))
            continue
        first = pair.feasible(lo)
        if first is None or first:
            if first:
                _remember(key, known_lo, min(known_hi, lo))
            continue
        hi = max(lo, 1.0) * 2
        while True:
            state = pair.feasible(hi)
            if state is None:
                break
            if state:
                break
            lo, hi = hi, hi * 2
        if state is None:
            continue
        while True:  # to adjacent floats: lo is then the largest infeasible one, whatever the start
            mid = (lo + hi) / 2
            if mid <= lo or mid >= hi:
                break
            state = pair.feasible(mid)
            if state is None:
                break
            if state:
                hi = mid
            else:
                lo = mid
        if state is None:
            continue
        # lo is infeasible: every plan's period is above it.
        _remember(key, lo, hi)
        best = Bound(lo, _reason(pair, s))
    return best


def _reason(pair: _StagePair, s: int) -> str:
    return (f"round trips sharing stage {s + 1}: {pair.pairs} worker pairs, {pair.cut} cut from stage "
            f"{s + 1}, {pair.orphan} without stage {s}, one micro-batch at a time")


def _adjacent(lo: float, hi: float) -> bool:
    """Whether no float lies between lo and hi (both finite): the bisection's end."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return False
    mid = (lo + hi) / 2
    return mid <= lo or mid >= hi


def _remember(key: tuple, lo: float, hi: float) -> None:
    if len(_CACHE) >= _CACHE_SIZE:
        _CACHE.clear()
    _CACHE[key] = (lo, hi)
