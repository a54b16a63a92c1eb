"""Trip-by-trip schedules: each micro-batch's whole round trip booked at once, into the gaps.

Where a stage is left to one worker, that worker's memory slots cycle through round trips of
unequal length (served below by its own pipeline, or across pipelines at two extra hops each), and
the best schedules keep the slots at a steady phase. Made-up 2 x 2 x 22 with (1, 0) dead: the
survivor holds two micro-batches, and a cycle of six trips, two own and one crossed per slot with
the slots half a cycle apart, keeps its own stage-1 peer 98% busy and never makes a slot wait
(58.74 ms per six, the LP's rate). The list scheduler decides one op at a time on each worker and
locks into a phase where the slots collide (485.3 ms in a 10 s plan against that pattern's 470.8).

This is a serial schedule generation scheme. Trip k books its forwards down and its input
gradients up at once, each at the earliest gap of its worker at or after its input (gap
insertion), choosing each stage's worker by where the whole trip ends (the stages below it first
on the same pipeline). A trip's weight gradients are not booked with it: they are booked when a
later trip needs the memory they free (at the earliest gap after their B), or at the end in the
earliest gaps left, so a W never takes the place a later trip's F or B needed. The k-th forward at
stage 0 is held until k x `cadence`, which sets the slots' phases; a few cadences around the
bound's rate per micro-batch are tried (`trip_candidates`).

Only the orders are kept: `planner.cp.orders.retime` gives the times, so rules 1-5 hold by
construction; rule 6 holds because every booking is checked against the worker's memory profile
with the unbooked W's held (the orders give the same profile as the times). Each candidate is
still validated before it is offered.
"""

from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterator

from planner.bounds import alive_per_stage
from planner.cp.orders import retime
from planner.spec import JobSpec, Worker
from planner.timeline import Key, Op, Orders
from planner.validate import validate

TRIPS_MAX_OPS = 600
"""Jobs up to this many F/B/W ops get trip schedules (each costs ~0.15 s at 550 ops: every
booking re-checks the worker's memory profile, and each stage's worker is chosen by booking the
trip once per alive peer)."""
TRIP_CADENCES = (0.8, 1.05, 0.95, 0.7, 1.1, 0.0)
"""Cadences tried, in units of the bound's time per micro-batch, most often winning first (made-up
lone-survivor jobs: 2 x 2 x 22 best at 0.7-0.95, 4 x 2 x 23 at 1.1, 3 x 3 x 13 at 1.05); 0 books
every trip as early as it fits."""
TRIPS_BUDGET_SHARE = 0.15
"""Share of the constructive search's budget the cadences may take (counted from the first one;
the first always runs)."""
_EPS = 1e-9
_MAX_RETRIES = 10_000


def lone_survivor_stages(job: JobSpec, failed: tuple[Worker, ...] | list[Worker]) -> list[int]:
    """Stages left to exactly one alive worker (of two or more pipelines)."""
    if job.pipelines < 2:
        return []
    return [s for s, alive in enumerate(alive_per_stage(job, failed)) if alive == 1]


def trips_apply(job: JobSpec, failed: tuple[Worker, ...] | list[Worker]) -> bool:
    """Whether `trip_candidates` makes any: some stage left to one worker, at most
    `TRIPS_MAX_OPS` F/B/W ops."""
    return bool(failed) and job.op_count <= TRIPS_MAX_OPS and bool(lone_survivor_stages(job, failed))


def trip_candidates(job: JobSpec, failed: tuple[Worker, ...], bound_ms: float,
                    deadline: float = math.inf) -> Iterator[tuple[list[Op], str]]:
    """Valid trip schedules (ops, name), one per cadence in `TRIP_CADENCES`, until `deadline`
    (`time.perf_counter()`); nothing unless `trips_apply`. `bound_ms` (the failure set's lower
    bound) sets the cadences' unit."""
    if not trips_apply(job, failed):
        return
    costs = job.costs
    tail = max(a + o for a, o in zip(costs.allreduce, costs.optimizer, strict=True))
    per_microbatch = max(0.0, bound_ms - tail) / (job.pipelines * job.microbatches)
    for tried, factor in enumerate(TRIP_CADENCES):
        if tried and time.perf_counter() > deadline:
            return
        orders = trip_orders(job, failed, cadence_ms=factor * per_microbatch)
        if orders is None:
            continue
        ops = retime(job, orders).ops
        if not validate(job, failed, ops):
            yield ops, f"trips(cadence={factor:g})"


class _Worker:
    """One worker's bookings: compute intervals (sorted), memory events, W's not yet booked."""

    __slots__ = ("busy", "memory", "pending")

    def __init__(self) -> None:
        self.busy: list[tuple[float, float]] = []
        self.memory: list[tuple[float, int, float]] = []  # (time, 0 free / 1 allocate, MB)
        self.pending: list[tuple[float, Key]] = []  # (its B's end, the W)

    def earliest(self, at: float, duration: float, extra: list[tuple[float, float]]) -> float:
        """Earliest start >= `at` of an op lasting `duration` in the gaps (also of `extra`)."""
        busy = self.busy
        while True:
            i = bisect.bisect_right(busy, (at, math.inf)) - 1
            if i >= 0 and busy[i][1] > at + _EPS:
                at = busy[i][1]
            i += 1
            while i < len(busy) and busy[i][0] < at + duration - _EPS:
                at = max(at, busy[i][1])
                i += 1
            clash = [end for start, end in extra if start < at + duration - _EPS and end > at + _EPS]
            if not clash:
                return at
            at = max(clash)


def _book(workers, taken, ops, w: Worker, kind: str, at: float, costs) -> float:
    """Book `kind` at stage w[1] on w tentatively (in `taken` and `ops`): its end."""
    duration = costs.duration(kind, w[1])
    start = workers[w].earliest(at, duration, taken.get(w, []))
    taken.setdefault(w, []).append((start, start + duration))
    ops.append((w, kind, w[1], start, start + duration))
    return start + duration


def _over(events: list[tuple[float, int, float]], limit: float) -> bool:
    """Whether the memory held ever exceeds `limit` (frees before allocations at equal times,
    as on one worker an op ending at t precedes one starting at t)."""
    held = 0.0
    for _, _, delta in sorted(events):
        held += delta
        if held > limit + 1e-6:
            return True
    return False


def trip_orders(job: JobSpec, failed: tuple[Worker, ...], cadence_ms: float = 0.0) -> Orders | None:
    """Every worker's op order from booking the micro-batches' round trips one after another
    (module docstring); None when a trip finds no memory (a job whose limit holds nothing)."""
    costs = job.costs
    S, D = job.stages, job.pipelines
    dead = set(failed)
    alive = [[p for p in range(D) if (p, s) not in dead] for s in range(S)]
    workers = {(p, s): _Worker() for s in range(S) for p in alive[s]}
    booked: dict[Key, tuple[Worker, float, float]] = {}
    limit = costs.memory_limit_mb

    def hop(s: int, upper: int, lower: int) -> float:
        return costs.hop_ms(s, upper != lower)

    def book_trip(route: list[int], released: float):
        """The trip on `route` (a pipeline per stage), tentatively: its F's and B's, the W's it
        had to book to free memory, where its stage-0 B ends; None if it never fits."""
        earliest_f = [released] + [0.0] * (S - 1)
        flushed: dict[Worker, list[tuple[float, float, Key]]] = {}  # W's booked for it: (start, end, W)
        for _ in range(_MAX_RETRIES):
            taken = {w: [(a, b) for a, b, _ in lst] for w, lst in flushed.items()}
            ops: list[tuple[Worker, str, int, float, float]] = []
            f_end = [0.0] * S
            for s in range(S):
                arrival = 0.0 if s == 0 else f_end[s - 1] + hop(s - 1, route[s - 1], route[s])
                f_end[s] = _book(workers, taken, ops, (route[s], s), "F", max(arrival, earliest_f[s]), costs)
            b_end = [0.0] * S
            for s in range(S - 1, -1, -1):
                arrival = f_end[s] if s == S - 1 else b_end[s + 1] + hop(s, route[s], route[s + 1])
                b_end[s] = _book(workers, taken, ops, (route[s], s), "B", arrival, costs)
            short = _short_of_memory(ops, flushed)
            if short is None:
                return ops, flushed, b_end[0]
            s, w, f_start = short
            if not _free_memory(w, s, f_start, flushed, earliest_f):
                return None
        return None

    def _short_of_memory(ops, flushed):
        """(stage, worker, F start) of the first stage where the trip overflows memory, else None."""
        for s in range(S):
            f, b = ops[s], ops[2 * S - 1 - s]
            w = f[0]
            done = {key for _, _, key in flushed.get(w, [])}
            events = list(workers[w].memory)
            events += [(math.inf, 0, -costs.activation_w[key[3]])
                       for _, key in workers[w].pending if key not in done]
            events += [(end, 0, -costs.activation_w[key[3]]) for _, end, key in flushed.get(w, [])]
            events += [(f[3], 1, costs.activation[s]),
                       (b[4], 0, -(costs.activation[s] - costs.activation_w[s])),
                       (math.inf, 0, -costs.activation_w[s])]
            if _over(events, limit):
                return s, w, f[3]
        return None

    def _free_memory(w, s, f_start, flushed, earliest_f) -> bool:
        """Make room for the trip's F at stage s on w: book its oldest pending W when that frees
        memory no later than the next release already booked, else hold the F until that
        release. False when nothing will ever be freed."""
        mine = flushed.get(w, [])
        done = {key for _, _, key in mine}
        releases = [t for t, _, delta in workers[w].memory if delta < 0 and t > f_start + _EPS]
        releases += [end for _, end, _ in mine if end > f_start + _EPS]
        next_release = min(releases, default=math.inf)
        left = sorted((b_end, key) for b_end, key in workers[w].pending if key not in done)
        if left:
            b_end, key = left[0]
            duration = costs.backward_weight[key[3]]
            start = workers[w].earliest(b_end, duration, [(a, e) for a, e, _ in mine])
            if start + duration <= next_release + _EPS:
                flushed.setdefault(w, []).append((start, start + duration, key))
                return True
        if next_release == math.inf:
            return False
        earliest_f[s] = max(earliest_f[s], next_release)
        return True

    def commit(trip, home: int, m: int) -> None:
        ops, flushed, _ = trip
        for w, lst in flushed.items():
            state = workers[w]
            for start, end, key in lst:
                bisect.insort(state.busy, (start, end))
                booked[key] = (w, start, end)
                state.memory.append((end, 0, -costs.activation_w[key[3]]))
                state.pending = [entry for entry in state.pending if entry[1] != key]
        for w, kind, s, start, end in ops:
            bisect.insort(workers[w].busy, (start, end))
            booked[(kind, home, m, s)] = (w, start, end)
        for s in range(S):
            f, b = ops[s], ops[2 * S - 1 - s]
            state = workers[f[0]]
            state.memory += [(f[3], 1, costs.activation[s]),
                             (b[4], 0, -(costs.activation[s] - costs.activation_w[s]))]
            state.pending.append((b[4], ("W", home, m, s)))

    for k in range(D * job.microbatches):
        home, m = k % D, k // D
        route: list[int] = []
        chosen = None
        for s in range(S):
            best = None
            for p in alive[s]:
                # The stages below on the same pipeline where it is alive (the fewest crossings).
                trial = route + [p]
                for below in range(s + 1, S):
                    trial.append(trial[-1] if trial[-1] in alive[below] else alive[below][0])
                trip = book_trip(trial, k * cadence_ms)
                if trip is None:
                    continue
                rank = (trip[2], max(op[4] for op in trip[0]))
                if best is None or rank < best[0]:
                    best = (rank, p, trip)
            if best is None:
                return None
            route.append(best[1])
            chosen = best[2]
        commit(chosen, home, m)
    for w, state in workers.items():
        for b_end, key in sorted(state.pending):
            duration = costs.backward_weight[key[3]]
            start = state.earliest(b_end, duration, [])
            bisect.insort(state.busy, (start, start + duration))
            booked[key] = (w, start, start + duration)
    orders: dict[Worker, list[tuple[float, float, Key]]] = {w: [] for w in workers}
    for key, (w, start, end) in booked.items():
        orders[w].append((start, end, key))
    return {w: [key for _, _, key in sorted(seq)] for w, seq in orders.items()}
