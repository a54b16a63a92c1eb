"""Zero Bubble's automatic-schedule greedy (ZB-1p / ZB-2p), re-implemented as a fault-free candidate.

The rules are those of Zero Bubble's heuristic (Qi et al., ICLR 2024; `Graph.manual_order` in their
repository, ported verbatim for comparison in benchmarks/zb_reference/). Having the same rules in
the portfolio makes the planner's fault-free plan never slower than ZB's heuristic, by construction
(benchmarks/vs_zero_bubble.py checks it on the paper's profiles). Differences, all generalisations:
per-stage hop delays (`p2p_ms` per stage instead of one `comm`), explicit start times, and a
schedule that would need an op before its input was placed returns None instead of a wrong time.

The greedy, per micro-batch index i, over all stages at once:
- i = 0: one F per stage; then, from the last stage up, as many extra F's as fit (memory) before
  the first B can arrive and, unless variant `bubble_before_first_b`, the one F that ends after it
  (delaying that B), made strictly decreasing down the pipeline; then the first B of every
  stage, last stage first.
- i > 0: each stage that still has forwards runs one more F, unless (variant `prioritize_b`) it
  is two or more F's ahead of the next stage and an F now would delay the next stage's B; a stage
  runs no F unless the next one does. Before each F (and each B), W's fill the wait for the input:
  every W that ends before the input arrives, W's forced in while the F does not fit memory, and one
  more W that overruns the arrival when the idle time would be no worse than the most idle stage's
  so far (variant `no_bubble_greedy`) or always when it is worse. Then the B of index i, last stage
  first; stage 0 drains its W's before its last B.
- Finally every stage runs its remaining W's.
Our extensions: `early_stages` (see `EARLY_STAGE_SHARES`) adds a forward to the warm-up of the
first stages, and `overrun_above` (see `overrun_threshold`) lets each stage choose between ZB's two
warm-up variants by the wait it would be left with; with neither the schedule is ZB's.
"""

from __future__ import annotations

import json
import math
from functools import lru_cache
from itertools import product

from planner.heuristic import collectives
from planner.simulator import ReplayError, replay
from planner.spec import JobSpec
from planner.timeline import Op
from planner.validate import validate

VARIANTS = list(product((True, False), repeat=3))
"""(bubble_before_first_b, prioritize_b, no_bubble_greedy): ZB tries all eight."""
EARLY_STAGE_SHARES = (0.25, 0.5, 0.75)
"""Our extension. ZB's warm-up stops a stage's forwards where the next would end after its first
B arrives, so stage s idles (S - 1 - s) x (2 hops + B - F) before that B (measured: 5.32 ms at
stage 0 of the 6.2B profile at twice 1F1B memory, the whole of ZB-2p's 0.0028 bubble). One more
forward on the first k stages, memory permitting, fills that wait; the idle moves to stage k, so
k = S/2 halves the largest (6.2B 2p, W share 0.5: 1901.32 -> 1898.28 ms; 14.6B: 1478.70 -> 1473.42)."""


class _Stuck(Exception):
    """An op's input was not placed yet, or memory cannot be freed: no schedule from this variant."""


class _Greedy:
    def __init__(self, job: JobSpec):
        c = job.costs
        self.S, self.M = job.stages, job.microbatches
        self.dur = {"F": c.forward, "B": c.backward_input, "W": c.backward_weight}
        # Memory change when the op is placed: F takes act, B frees act - act_w, W frees act_w.
        self.mem_delta = {"F": list(c.activation),
                          "B": [aw - a for a, aw in zip(c.activation, c.activation_w, strict=True)],
                          "W": [-aw for aw in c.activation_w]}
        self.limit = c.memory_limit_mb + 1e-9
        self.hop = [c.hop_ms(s, False) for s in range(self.S - 1)]
        S, M = self.S, self.M
        self.count = {k: [0] * S for k in "FBW"}
        self.free = [0.0] * S
        self.mem = [0.0] * S
        self.idle = [0.0] * S
        self.end = {k: [[None] * M for _ in range(S)] for k in "FB"}
        self.ops: list[tuple[int, str, int, float, float]] = []

    def arrival(self, kind: str, s: int, i: int) -> float:
        """When the input of op (kind, micro-batch i) reaches stage s."""
        if kind == "F" and s > 0:
            src = self.end["F"][s - 1][i]
            hop = self.hop[s - 1]
        elif kind == "B" and s < self.S - 1:
            src = self.end["B"][s + 1][i]
            hop = self.hop[s]
        else:
            return 0.0  # stage 0's F, the last stage's B (its F ran earlier on the same worker)
        if src is None:
            raise _Stuck
        return src + hop

    def put(self, s: int, kind: str) -> None:
        i = self.count[kind][s]
        ready = self.free[s] if kind == "W" else max(self.free[s], self.arrival(kind, s, i))
        if self.count["F"][s] > 0:
            self.idle[s] += ready - self.free[s]
        end = ready + self.dur[kind][s]
        self.ops.append((s, kind, i, ready, end))
        self.free[s] = end
        self.mem[s] += self.mem_delta[kind][s]
        if kind != "W":
            self.end[kind][s][i] = end
        self.count[kind][s] += 1

    def w_left(self, s: int) -> bool:
        return self.count["W"][s] < self.count["B"][s]

    def make_room(self, s: int, kind: str) -> None:
        while self.mem[s] + self.mem_delta[kind][s] > self.limit:
            if not self.w_left(s):
                raise _Stuck
            self.put(s, "W")

    def fill_before(self, s: int, at: float, no_bubble_greedy: bool) -> None:
        """W's in the wait for an input arriving at `at` (see the module docstring)."""
        w = self.dur["W"][s]
        while self.w_left(s) and self.free[s] + w <= at:
            self.put(s, "W")
        if self.w_left(s) and self.free[s] < at and (
                no_bubble_greedy or at - self.free[s] > max(self.idle) - self.idle[s]):
            self.put(s, "W")

    def warmup_counts(self, overrun_above: float) -> tuple[list[int], list[float]]:
        """Extra warm-up forwards per stage (after each stage's first F is placed) and the wait each
        stage is left with before its first B, from the last stage up: a stage runs the forwards
        that end before its first B can arrive, and the one that would end after it only when the
        wait it would otherwise leave exceeds `overrun_above` (that forward delays the first B, so
        every earlier stage's arrival with it)."""
        S, M, F, B = self.S, self.M, self.dur["F"], self.dur["B"]
        extra, wait = [0] * S, [0.0] * S
        last = 0.0
        for s in range(S - 1, -1, -1):
            if s == S - 1:
                last = self.end["F"][s][0] + B[s]
                continue
            mem, t, due = self.mem[s], self.free[s], last + self.hop[s]
            while self.count["F"][s] + extra[s] < M and mem + self.mem_delta["F"][s] <= self.limit:
                if t + F[s] > due and not due - t > overrun_above:
                    break
                mem += self.mem_delta["F"][s]
                t += F[s]
                extra[s] += 1
            wait[s] = max(0.0, due - t)
            last = max(t, due) + B[s]
        return extra, wait

    def first_forwards(self) -> None:
        """Every stage's first F, which the warm-up counts start from."""
        for s in range(self.S):
            self.put(s, "F")

    def warmup(self, overrun_above: float, early_stages: int = 0) -> None:
        S, M = self.S, self.M
        self.first_forwards()
        extra, _ = self.warmup_counts(overrun_above)
        for s in range(1, S):
            while extra[s] > 0 and extra[s] >= extra[s - 1] and self.count["F"][s] + extra[s] < M:
                extra[s] -= 1
        for s in range(min(early_stages, S - 1)):  # our extension (ZB: early_stages = 0)
            if self.count["F"][s] + extra[s] + 1 > M or \
                    self.mem[s] + (extra[s] + 1) * self.mem_delta["F"][s] > self.limit:
                break  # a prefix only: the warm-ups stay strictly decreasing down the pipeline
            extra[s] += 1
        for s in range(S):
            for _ in range(extra[s]):
                self.put(s, "F")
        for s in range(S - 1, -1, -1):
            self.put(s, "B")

    def wants_forward(self, s: int, prioritize_b: bool) -> bool:
        F, B, W = self.dur["F"], self.dur["B"], self.dur["W"]
        nf = self.count["F"]
        if nf[s] >= self.M:
            return False
        if not (prioritize_b and s + 1 < self.S and nf[s] >= nf[s + 1] + 2):
            return True
        next_b_due = self.free[s + 1] + F[s + 1] + B[s + 1] + self.hop[s]
        if self.free[s] >= next_b_due:
            return False
        forced_w, mem, n = 0.0, self.mem[s] + self.mem_delta["F"][s], 0
        while mem > self.limit and self.count["W"][s] + n < self.count["B"][s]:
            forced_w += W[s]
            mem += self.mem_delta["W"][s]
            n += 1
        if self.free[s] + F[s] + forced_w <= next_b_due:
            return True
        return next_b_due - self.free[s] > max(self.idle) - self.idle[s]

    def step(self, i: int, prioritize_b: bool, no_bubble_greedy: bool) -> None:
        S = self.S
        run_f = [self.wants_forward(s, prioritize_b) for s in range(S)]
        for s in range(S - 2, -1, -1):
            run_f[s] = run_f[s] and run_f[s + 1]
        for s in range(S):
            if run_f[s]:
                self.make_room(s, "F")
                if s > 0:
                    self.fill_before(s, self.arrival("F", s, self.count["F"][s]), no_bubble_greedy)
                self.put(s, "F")
        for s in range(S - 1, -1, -1):
            self.make_room(s, "B")
            if s + 1 < S:
                self.fill_before(s, self.arrival("B", s, i), no_bubble_greedy)
            if s == 0 and self.count["F"][s] == self.M:
                while self.w_left(s):
                    self.put(s, "W")
            self.put(s, "B")


def zb_greedy_schedule(job: JobSpec, bubble_before_first_b: bool, prioritize_b: bool,
                       no_bubble_greedy: bool, early_stages: int = 0,
                       overrun_above: float | None = None) -> list[Op] | None:
    """One variant's schedule of a job without failures (every pipeline the same), or None.
    `early_stages` > 0 and `overrun_above` are our extensions (see `EARLY_STAGE_SHARES` and
    `overrun_threshold`); with both left out the schedule is ZB's heuristic. `overrun_above`, when
    given, replaces `bubble_before_first_b` (True: never overrun, an infinite threshold; False:
    always, threshold 0)."""
    if overrun_above is None:
        overrun_above = math.inf if bubble_before_first_b else 0.0
    g = _Greedy(job)
    try:
        g.warmup(overrun_above, early_stages)
        for i in range(1, job.microbatches):
            g.step(i, prioritize_b, no_bubble_greedy)
        for s in range(job.stages):
            while g.count["W"][s] < job.microbatches:
                g.put(s, "W")
    except _Stuck:
        return None
    if any(n != job.microbatches for k in "FB" for n in g.count[k]):
        return None  # stage s ran out of forwards before the others (m < p corner cases)
    ops = [Op((p, s), kind, (p, i), start, end)
           for p in range(job.pipelines) for s, kind, i, start, end in g.ops]
    for s in range(job.stages):
        ops.extend(collectives(job, s, set(), g.free[s]))
    # ZB places the first F of every stage without a memory check: a limit below one micro-batch's
    # activation (or rounding at the limit) must not reach the planner as a valid-looking schedule.
    return None if validate(job, (), ops) else ops


def overrun_threshold(job: JobSpec) -> float | None:
    """The per-stage warm-up rule's threshold that leaves the smallest largest wait before a first B.

    ZB's variants overrun the first B at every stage or at none. Stage s's wait is the first B's
    round trip below it modulo F, so it varies stage by stage (28.3B profile at twice 1F1B memory:
    0.62 ms x (S - 1 - s) modulo 10.4, 9.92 ms at stage 15) and the most idle stage sets the period.
    Overrunning only where the wait exceeds a threshold moves that idle into a delay of the first
    B of every earlier stage, which their own waits absorb up to the memory-bound stage 0 (there:
    9.92 -> 9.30 ms, 2726.72 -> 2726.10 ms). Candidates are the waits left by never overrunning,
    each just below itself; only the warm-up is simulated here (cheap), and the schedule with the
    returned threshold is replayed by the caller like every other candidate. None: no stage waits.
    """
    g = _Greedy(job)
    g.first_forwards()
    _, waits = g.warmup_counts(math.inf)
    best: tuple[float, float] | None = None  # (largest wait left, -threshold)
    for wait in sorted({w for w in waits if w > 1e-9}, reverse=True):
        threshold = wait * (1 - 1e-9)
        key = (max(g.warmup_counts(threshold)[1]), -threshold)
        if best is None or key < best:
            best = key
    return None if best is None or best[0] >= max(waits) - 1e-9 else -best[1]


def zb_greedy_candidates(job: JobSpec):
    """(schedule or None, name) for ZB's eight variants (early = 0), each also with the first
    `share x S` stages running one more warm-up forward (distinct counts only), then the four
    variants of `overrun_threshold`'s per-stage warm-up rule when it lowers the largest wait."""
    counts = sorted({0} | {max(1, int(share * job.stages)) for share in EARLY_STAGE_SHARES} - {job.stages})
    for early in counts:
        for variant in VARIANTS:
            flags = "first_b_bubble={},prioritize_b={},no_bubble_greedy={}".format(*map(int, variant))
            yield zb_greedy_schedule(job, *variant, early_stages=early), f"zb-greedy({flags},early={early})"
    threshold = overrun_threshold(job)
    if threshold is not None:
        for prioritize_b, no_bubble_greedy in product((True, False), repeat=2):
            flags = (f"overrun_above={threshold:.4g},prioritize_b={prioritize_b:d},"
                     f"no_bubble_greedy={no_bubble_greedy:d}")
            yield (zb_greedy_schedule(job, True, prioritize_b, no_bubble_greedy, overrun_above=threshold),
                   f"zb-greedy({flags})")


def zb_greedy_templates(job: JobSpec, count: int) -> list[tuple[list[Op], str]]:
    """Up to `count` distinct schedules of `zb_greedy_candidates` on one pipeline of the job, least
    replayed period first (ties: the order they are made in), each with its name: fault-free
    templates that re-routed work is inserted into (`candidates.best_heuristic`). The cached
    fault-free plan is a faster schedule found from these by adjacent order swaps
    (`planner.fault_free`), but a faster fault-free order is not always the better one to insert
    into: made-up 5 x 8 x 12 with (3, 4) dead, 343.6 ms inserted into the cached plan (317.3
    fault-free), 335.3 into the greedy's (319.2). Cached per job (every failure set of a job
    precomputed asks again: 0.3 s at 1 x 16 x 64)."""
    one = json.dumps({**job.filled(), "pipelines": 1}, sort_keys=True)
    return [(list(ops), name) for ops, name in _ranked_templates(one, count)]


@lru_cache(maxsize=16)
def _ranked_templates(one_pipeline: str, count: int) -> tuple[tuple[tuple[Op, ...], str], ...]:
    one = JobSpec.model_validate(json.loads(one_pipeline))
    ranked: dict[tuple, tuple[float, int, list[Op], str]] = {}
    for made, (ops, name) in enumerate(zb_greedy_candidates(one)):
        if ops is None:
            continue
        key = tuple((op.worker, op.kind, op.microbatch) for op in sorted(ops, key=_start_order))
        if key in ranked:
            continue
        try:
            report = replay(one, ops)
        except ReplayError:
            continue
        if report.converged:
            ranked[key] = (report.iteration_ms, made, ops, name)
    best = sorted(ranked.values(), key=lambda entry: entry[:2])[:count]
    return tuple((tuple(ops), name) for _, _, ops, name in best)


def _start_order(op: Op) -> tuple:
    return (op.start_ms, op.worker, op.kind)
