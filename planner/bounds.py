"""Proven lower bounds on the steady-state period for a failure set (derivations here and in
docs/notes/bounds.md).

Notation: stage s has `alive_s` workers, so its busiest worker runs at least
`n_s = ceil(D*M / alive_s)` micro-batches; `hop_s` is the smallest delay of a hop between stages s and
s+1 (same or cross pipeline); `a_s` = activation_mb, `aw_s` = activation_w_mb (held from B end to W
end), L = memory_limit_mb; `k_s = floor(L / a_s)` is how many micro-batches a worker of stage s can
hold between F start and B end at once. A worker's period is its busy time plus its idle time within
one iteration, because it starts iteration i+1 only after its own optimizer step of iteration i.

1. Work + fill + drain (per stage s). Until the first B of the iteration reaches a worker, it can run
   only forwards (W needs a B first), at most `k_s` of them, yet that first B cannot start before
   `F_s + chain_s` after its first F, where `chain_s = sum_{t>s}(F_t + B_t) + sum_{t>=s} 2*hop_t`:
   fill idle >= F_s + chain_s - min(k_s, n_s)*F_s. After the worker's last F ends, that micro-batch's
   B is again `chain_s` away, and meanwhile the worker can only run what it holds when that F
   starts: x micro-batches between F and B end (B + W each) and y between B end and W end (W
   each), with a*(1 + x) + aw*y <= L and x + y <= n - 1 (`drain_work`); drain idle >= chain_s -
   drain_work (with aw = a this is the (min(k, n) - 1)*(B + W) of 1F1B). When n_s > k_s the two
   windows are disjoint (the (k+1)-th F needs memory that only a B or W end frees, and both follow
   a B), so
   P >= n_s*(F+B+W)_s + AR_s + OPT_s + fill + drain; otherwise the larger of the two idles counts.
   (More micro-batches never lower this expression, so the busiest worker gives the bound.) For the
   Zero Bubble 6.2B profile at p=8, m=24 this is exactly ZB-H1's (p-1)(F+B-W) bubble plus hops.
2. Round trip (stages a <= b). All stage-a workers start their all-reduce together, after every W of
   stage a, and each starts its next iteration after its own optimizer, so for the stage-a worker
   whose iteration starts first, P >= (time from that start to the last W end at stage a) + AR_a +
   OPT_a. The busiest stage-b worker must run its n_b forwards and n_b input-gradients after the
   first forward reaches it; the last of those gradients then travels back to stage a and its
   W_a follows: P >= fwd_chain(a..b) + n_b*(F_b + B_b) + bwd_chain(b..a) + W_a + AR_a + OPT_a,
   where the chains are the F (resp. B) times of the stages strictly between plus the hops. When
   the stage-b worker starts its last B every other micro-batch is past its B, so it holds a_b for
   that one plus aw_b for each whose W is pending: at most y = floor((L - a_b) / aw_b) pending,
   and at least n_b - 1 - y W's already ran before (added to the stage-b term), and the stage-b
   worker's forced idle of 1 lies inside the same stretch (its first op -> its last B end). A W
   deferred past the last B cannot also fill the drain window after the last F (its micro-batch
   is held when that F starts), so the drain counts x B + (x + y' - y) W and the stretch is the
   least over y (`stretch_to_last_b`; docs/notes/bounds.md, section 2).
3. Memory-time (per stage s). Each micro-batch holds a_s from F start to B end for >= F + chain + B,
   at most min(k, n) at once, then aw_s until W end for >= W: first op -> last B end >= n (F + chain
   + B) / min(k, n), and first op -> last W end >= n (a (F + chain + B) + aw W) / L. This also
   bounds the round trip's stretch.
4. Sharing (`planner.bounds_sharing`): when a failure cuts some of a stage's workers from the next
   stage, those pay cross-pipeline hops on every round trip; the stage's micro-batches must be
   shared so that every worker's own bound holds.
5. Pairs (`planner.bounds_pairs`): where two adjacent stages hold one micro-batch at a time, a
   stage-(s + 1) worker serving its own pipeline's round trips back to back leaves gaps no other
   round trip fits in, and one fitted between them makes its own stage-s worker wait; the counts
   per worker pair must still cover the stage.
6. F starts paced by round trips (`paced_stage`, docs/notes/bounds.md section 7): the busiest
   worker's j-th F needs room for one more activation, so j - x B's (x held) and j - x - y_max(x)
   W's have ended. The worker is one machine: after micro-batch i's B is released (its F start +
   F + chain), it still runs the B's and W's of the later ones that must have ended and the F's
   that need them, one at a time. The least last F start, last B end (the stretch of 2 and 3) and
   last W end follow.
7. First and last waves (`planner.bounds_wave`): where a stage's workers hold one micro-batch at a
   time and outnumber the next stage's slots, the first micro-batches of some of them wait a
   whole next-stage window at the start of the iteration, and the last ones of some come back a
   window early at its end, which lengthens those workers' chains.
8. Late round trips (`planner.bounds_late`): where a stage on the way from a to t has fewer alive
   workers than t, some stage-t workers receive their first micro-batch (or send their last one
   back) one or more ops late, and bound 2's round trip through them is that much longer.
9. Late round trips against the stage's span (`planner.bounds_span`): a stage-t worker that
   starts late because of 8 and works without a break ends late, and stage t all-reduces after
   its latest worker; waiting for the latest costs bound 8's round trip instead. The plan picks
   how long the early workers wait and which worker is late at which end; no choice covers the
   stage below this bound.
10. A stage short of memory above starves the fill (`planner.bounds_feed`): until a B comes back
   to a stage u above stage t, stage u holds every micro-batch it has started, so stage t's workers
   together start at most alive_u x k_u forwards before their first B's; where bound 1's fill
   needs more, some of them idle longer, and the stage's micro-batches must still be covered.
11. The first gradients queue at a narrower stage below (`planner.bounds_queue`): with fewer
   survivors at stage t + 1 than at t, some stage-(t + 1) worker serves two or more of stage t's
   first round trips in a row, inside the window a stage-t worker's own forwards cover; stage t
   all-reduces together, so starting a worker later only moves its idle to the others.
12. A survivor's round trips priced by its own chain (`planner.bounds_priced`): where stage s
   is left with one worker (or its busiest of fewer than D), only the micro-batches its own
   pipeline serves below avoid the cross-pipeline hops, and that pipeline's workers take only so
   many; 6's inequalities, chained with every slow one's release later, give an LP over which of
   them the plan can dodge.
13. Memory tokens queued at a stage below (`planner.bounds_tokens`): stage s's workers hold at most
   alive_s x k_s micro-batches between F start and B end, and each needs a stage-j worker for its F
   and B; where the tokens come back faster than stage j serves them, they wait there (at the start
   of the iteration above all), and the next micro-batch of each token starts later.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from planner.spec import JobSpec, StageCosts, Worker

_EPS = 1e-9
MEMORY_TOLERANCE_MB = 1e-6
"""The validator accepts a worker holding up to memory_limit_mb + 1e-6 (planner/validate.py EPS); the
bounds count memory against that larger limit, so no plan the validator accepts holds more
micro-batches than a bound assumes."""


def holds(costs: StageCosts, s: int, cap: int) -> int:
    """Most stage-s micro-batches one worker may hold between F start and B end (at most cap)."""
    act = costs.activation[s]
    # Compared as floats first: a tiny activation makes the quotient too large for int().
    fit = (costs.memory_limit_mb + MEMORY_TOLERANCE_MB) / act + _EPS if act > 0 else float("inf")
    return cap if fit >= cap else int(fit)


def pending_w_cap(costs: StageCosts, s: int, held_full: int, cap: int) -> int:
    """Most stage-s micro-batches a worker can hold between B end and W end (each `activation_w`)
    while it also holds `held_full` between F start and B end (each `activation`); at most cap."""
    room = costs.memory_limit_mb + MEMORY_TOLERANCE_MB - held_full * costs.activation[s]
    if room < -_EPS:
        return -1
    aw = costs.activation_w[s]
    fit = room / aw + _EPS if aw > 0 else float("inf")
    return cap if fit >= cap else int(fit)


def held_at_last_f(costs: StageCosts, s: int, n: int, k: int) -> list[tuple[int, int]]:
    """(x, y') pairs a stage-s worker may hold when its last F starts, each y' the largest for its
    x: x other micro-batches between F start and B end (plus the last: x + 1 <= k), y' between B
    end and W end, within the memory limit and x + y' <= n - 1."""
    pairs = []
    for x in range(min(k, n)):
        y = pending_w_cap(costs, s, x + 1, n - 1 - x)
        if y >= 0:
            pairs.append((x, y))
    return pairs


def drain_work(costs: StageCosts, s: int, n: int, k: int, deferred: int = 0) -> float | None:
    """Most B/W work a stage-s worker can run between its last F and that micro-batch's B when
    `deferred` of the micro-batches it holds run their W only after its last B (module docstring,
    2.); None when it cannot hold that many."""
    b, w = costs.backward_input[s], costs.backward_weight[s]
    works = [x * b + (x + y - deferred) * w for x, y in held_at_last_f(costs, s, n, k) if x + y >= deferred]
    return max(works, default=None)


def fill_idle(costs: StageCosts, s: int, n: int, k: int, chain: float) -> float:
    """Bound 1's idle of a stage-s worker before its first B: only forwards can run, at most
    min(k, n) of them, while the first one's gradient travels `chain` (module docstring, 1.)."""
    return max(0.0, costs.forward[s] + chain - min(k, n) * costs.forward[s])


def drain_idle(costs: StageCosts, s: int, n: int, k: int, chain: float) -> float:
    """Bound 1's idle of a stage-s worker after its last F: that micro-batch's B is `chain` away,
    less the B/W work of what it holds (`drain_work`; module docstring, 1.)."""
    return max(0.0, chain - (drain_work(costs, s, n, k) or 0.0))


def forced_idle(costs: StageCosts, s: int, n: int, k: int, chain: float) -> float:
    """Bound 1's idle of a stage-s worker with n micro-batches, k held at once and round trip
    `chain` below it: before its first B and after its last F (module docstring, 1.)."""
    return fill_and_drain(fill_idle(costs, s, n, k, chain), drain_idle(costs, s, n, k, chain), n, k)


def fill_and_drain(fill: float, after_last_f: float, n: int, k: int) -> float:
    """A worker's idle before its first B (`fill`) and after its last F (`after_last_f`) together.
    The two windows are disjoint when n > k (the (k+1)-th F needs memory a W frees, and a W needs a
    B); otherwise only the larger counts."""
    return fill + after_last_f if n > k else max(fill, after_last_f)


def worker_span(costs: StageCosts, t: int, n: int, k: int, chain: float, after_last_f: float) -> float:
    """The least period a stage-t worker with n micro-batches allows when it runs k forwards before
    its first B, whose gradient is `chain` away: its work, all-reduce and optimizer, the fill idle
    (`fill_idle`) and the idle `after_last_f` (`drain_idle`), summed where n > k (its last F is not
    one of the k, so the drain window follows the fill window), the larger of the two otherwise
    (bounds 10 and 11: the forwards a pool above allows, the chain a queue below lengthens)."""
    idle = fill_and_drain(fill_idle(costs, t, n, k, chain), after_last_f, n, k)
    return (n * (costs.forward[t] + costs.backward_input[t] + costs.backward_weight[t])
            + costs.allreduce[t] + costs.optimizer[t] + idle)


def stretch_to_last_b(costs: StageCosts, s: int, n: int, k: int, chain: float, fill: float) -> float:
    """Least time from a stage-s worker's first op to its last B end (module docstring, 2.): every
    F and B, the W's not deferred past the last B, and the fill and drain idle, where deferring a W
    takes it out of the drain window too. Minimised over how many W's are deferred."""
    f, b, w = costs.forward[s], costs.backward_input[s], costs.backward_weight[s]
    # Most drain work with `deferred` W's out of it: the best pair holding at least that many,
    # less the deferred W's (a suffix maximum over pairs by how many they hold: linear, not n x k).
    pairs = held_at_last_f(costs, s, n, k)
    most = max((x + y for x, y in pairs), default=-1)
    best_holding = [float("-inf")] * (most + 2)
    for x, y in pairs:
        best_holding[x + y] = max(best_holding[x + y], x * b + (x + y) * w)
    for held in range(most - 1, -1, -1):
        best_holding[held] = max(best_holding[held], best_holding[held + 1])
    stretches = []
    for deferred in range(min(max(0, pending_w_cap(costs, s, 1, n - 1)), most) + 1):
        drain = max(0.0, chain - (best_holding[deferred] - deferred * w))
        idle = fill + drain if n > k else max(fill, drain)
        stretches.append(n * (f + b) + (n - 1 - deferred) * w + idle)
    # No pair at all (not even one micro-batch fits: no valid plan): F's, B's and the fill still hold.
    return min(stretches, default=n * (f + b) + fill)


def first_op_to_last_b(costs: StageCosts, s: int, n: int, k: int, chain: float, paced: Paced) -> float:
    """Least time from a stage-s worker's first op to its last B end with n micro-batches, k held at
    once (bound 2's stretch: work, forced idle, W's deferred past the last B; bound 3's round trips
    at most k at once; bound 6's pacing, `paced` = `paced_stage` of the same worker)."""
    round_trip = costs.forward[s] + chain + costs.backward_input[s]
    return max(stretch_to_last_b(costs, s, n, k, chain, fill_idle(costs, s, n, k, chain)),
               n * round_trip / max(min(k, n), 1), paced.last_b_end)


RECURRENCE_MAX_STEPS = 1_000_000
"""`paced_stage` runs n x min(k, n) steps; above this it is skipped (the weaker memory-time terms
still hold): a stage left with one worker of 1024 would otherwise take seconds."""


@dataclass(frozen=True, slots=True)
class Paced:
    """Least times from a stage-s worker's first F start (bound 6, docs/notes/bounds.md section 7)."""
    last_f_start: float
    last_b_end: float
    last_w_end: float


def paced_stage(costs: StageCosts, s: int, n: int, k: int, round_trip: float) -> Paced:
    """Least F starts, last B end and last W end of a stage-s worker with n micro-batches, k held at
    once, and `round_trip` (F + chain + B) the least time from a micro-batch's F start to its B end
    (module docstring, 6.). All 0 when skipped (`RECURRENCE_MAX_STEPS`)."""
    if n <= 1 or n * min(k, n) > RECURRENCE_MAX_STEPS:
        return Paced(0.0, 0.0, 0.0)
    return _paced(costs, s, n, k, round_trip)


@lru_cache(maxsize=4096)  # a job's candidate routings and its late round trips ask for the same stages
def _paced(costs: StageCosts, s: int, n: int, k: int, round_trip: float) -> Paced:
    starts, after_releases, held = _paced_run(costs, s, n, k, round_trip)
    return Paced(starts[-1], after_releases(n, 0, n - held), after_releases(n, n, n - held))


def paced_w_ends(costs: StageCosts, s: int, n: int, k: int, round_trip: float) -> list[float]:
    """`paced_stage(costs, s, m, k, round_trip).last_w_end` for every m = 0..n, from one run for n:
    for m >= min(k, n) the first m F starts do not depend on the cap (a cap above m only admits
    pending W's that no count below m can use), so each m's last W end reads the same running
    maxima; the few m below k run on their own. All 0 when the run for n is skipped."""
    if n <= 1 or n * min(k, n) > RECURRENCE_MAX_STEPS:
        return [0.0] * (n + 1)
    _, after_releases, held = _paced_run(costs, s, n, k, round_trip)
    small = max(held, 2)  # below it, m's own run (0 for m <= 1, as `paced_stage`)
    return [after_releases(m, m, m - held) if m >= small
            else paced_stage(costs, s, m, k, round_trip).last_w_end for m in range(n + 1)]


def _paced_run(costs: StageCosts, s: int, n: int, k: int, round_trip: float):
    """Bound 6's recurrence for n micro-batches: (the least F starts, the least end of a given
    number of B's, W's and F's after the releases, as `after_releases(backs, weights, forwards)`,
    and how many are held at most)."""
    held = min(k, n)
    f, b, w = costs.forward[s], costs.backward_input[s], costs.backward_weight[s]
    release = round_trip - b  # F start -> its B may start
    # Micro-batch i's B is released at start_i + release; after that the worker still runs the B's
    # of i..backs-1, the W's of i..weights-1 and every F numbered >= held + i (it needs i + 1 B's
    # ended). Which of the three counts applies depends on i, hence a prefix maximum per mix:
    # 0: B + W + F, 1: B + F, 2: B + W, 3: B alone (a mix that leaves out a count is still a bound).
    slopes = (b + w + f, b + f, b + w, b)
    # most[c][i]: the largest start_i' - i' x slopes[c] over i' <= i (the first F starts at 0).
    most: tuple[list[float], ...] = ([0.0], [0.0], [0.0], [0.0])

    def after_releases(backs: int, weights: int, forwards: int) -> float:
        # Every count is at most the number of starts known (forwards < backs, weights <= backs).
        best = most[3][backs - 1] if backs > 0 else float("-inf")
        if forwards > 0:
            best = max(best, most[1][forwards - 1] + forwards * f)
        if weights > 0:
            best = max(best, most[2][weights - 1] + weights * w)
            if forwards > 0:
                best = max(best, most[0][min(weights, forwards) - 1] + weights * w + forwards * f)
        return release + backs * b + best

    def append(start: float) -> None:
        i = len(starts)
        starts.append(start)
        for row, slope in zip(most, slopes, strict=True):
            row.append(max(row[-1], start - i * slope))

    # Per x (others between F start and B end when an F starts): how many may wait for their W.
    pending = [pending_w_cap(costs, s, x + 1, n) for x in range(held)]
    starts = [0.0]  # starts[j]: least start of the (j + 1)-th F
    for j in range(1, n):
        if j < held and pending[j] >= 0:  # x = j: all j held and one more fit, nothing need end
            append(starts[-1] + f)
            continue
        least = float("inf")
        for x, y in enumerate(pending):
            if x > j or y < 0:
                break  # x > j: fewer than x micro-batches started; y < 0: x + 1 do not fit
            # j - x B's and at least j - x - y W's have ended before the (j + 1)-th F starts.
            least = min(least, max(0.0, after_releases(j - x, j - x - y, j - held)))
        append(max(starts[-1] + f, least))
    return starts, after_releases, held


def stage_hops(costs: StageCosts, stages: int) -> list[float]:
    """`hop_s`, the least delay of a hop between stages s and s + 1, same or cross pipeline. The
    contract lets a validator read a per-stage hop as either stage's entry; the smallest of the two
    stages' entries keeps a bound valid under every reading."""
    return [min(costs.p2p[s], costs.cross_p2p[s], costs.p2p[s + 1], costs.cross_p2p[s + 1])
            for s in range(stages - 1)]


def chain_below(costs: StageCosts, hop: list[float], s: int) -> float:
    """The least round trip below stage s on one pipeline: every later stage's F and B, and each
    hop from s on there and back."""
    f, b = costs.forward, costs.backward_input
    return sum(f[t] + b[t] for t in range(s + 1, len(f))) + 2 * sum(hop[s:])


@dataclass(frozen=True, slots=True)
class Bound:
    value_ms: float
    reason: str


def alive_per_stage(job: JobSpec, failed: tuple[Worker, ...] | list[Worker]) -> list[int]:
    """How many workers of each stage the failure set leaves alive."""
    dead = set(map(tuple, failed))
    return [sum(1 for p in range(job.pipelines) if (p, s) not in dead) for s in range(job.stages)]


BISECTION_MS = 1e-9
"""Where a bound bisects on the period (bounds 9 and 10), it stops within this of the least
period that covers the stage."""


def bisect_covering(covers: Callable[[float], bool], low: float, high: float) -> tuple[float, float]:
    """(low, high) narrowed to within `BISECTION_MS`, from `covers(low)` false and `covers(high)`
    true (coverage grows with the period): low stays a period proven not to cover."""
    while high - low > BISECTION_MS:
        mid = (low + high) / 2
        if covers(mid):
            high = mid
        else:
            low = mid
    return low, high


def lower_bound(job: JobSpec, failed: tuple[Worker, ...] | list[Worker],
                busiest: list[int] | None = None) -> Bound:
    """The largest of the analytic bounds above; `reason` says which one binds.

    `busiest` (per stage: how many micro-batches the busiest worker runs, when a routing fixes it)
    replaces `n_s = ceil(D*M / alive_s)`: every bound above is argued for one worker with n_s
    micro-batches and grows with n_s, so it bounds every plan with that routing
    (`routing_bound`)."""
    if busiest is None:
        total = job.pipelines * job.microbatches
        busiest = [-(-total // a) for a in alive_per_stage(job, failed)]
    best = load_bound(job, busiest)
    from planner.bounds_sharing import sharing_bound  # it builds on this module's helpers

    sharing = sharing_bound(job, failed, floor_ms=best.value_ms)
    best = sharing if sharing.value_ms > best.value_ms else best
    from planner.bounds_pairs import pair_bound  # it builds on this module's helpers

    pairs = pair_bound(job, failed, floor_ms=best.value_ms)
    best = pairs if pairs.value_ms > best.value_ms else best
    from planner.bounds_wave import wave_bound  # it builds on bound 4's per-worker g

    wave = wave_bound(job, failed)
    best = wave if wave.value_ms > best.value_ms else best
    from planner.bounds_late import late_round_trip_bound  # it builds on bound 2's stretch

    late = late_round_trip_bound(job, failed)
    best = late if late.value_ms > best.value_ms else best
    from planner.bounds_feed import fed_fill_bound  # it builds on bound 1's fill and drain

    fed = fed_fill_bound(job, failed, floor_ms=best.value_ms)
    best = fed if fed.value_ms > best.value_ms else best
    from planner.bounds_queue import queued_fill_bound  # it builds on bound 1's fill and drain

    queued = queued_fill_bound(job, failed)
    best = queued if queued.value_ms > best.value_ms else best
    from planner.bounds_span import span_round_trip_bound  # it builds on bound 8's delays

    span = span_round_trip_bound(job, failed, floor_ms=best.value_ms)
    best = span if span.value_ms > best.value_ms else best
    from planner.bounds_priced import priced_round_trip_bound  # it builds on bound 6's recurrence

    priced = priced_round_trip_bound(job, failed, floor_ms=best.value_ms)
    best = priced if priced.value_ms > best.value_ms else best
    from planner.bounds_tokens import token_queue_bound  # it builds on bound 3's holds

    tokens = token_queue_bound(job, failed)
    return tokens if tokens.value_ms > best.value_ms else best


def routing_bound(job: JobSpec, busiest: list[int], failure_bound_ms: float) -> float:
    """`lower_bound(job, failed, busiest=busiest).value_ms` for a routing of the failure set whose
    bound is `failure_bound_ms` (`lower_bound(job, failed)`), without bounds 4-13 again: those do not
    depend on the loads, and `busiest` is at least the default n_s at every stage, where bounds 1-3
    only grow, so the largest of the routing's bounds 1-3 and the failure set's bound is the same
    number (`candidates._beaten` asks for it once per candidate routing: 0.8 of a 4.3 s solve of
    the 28B job re-ran bounds 4-8 five times)."""
    return max(load_bound(job, busiest).value_ms, failure_bound_ms)


def load_bound(job: JobSpec, busiest: list[int]) -> Bound:
    """Bounds 1-3 and the round trips of bound 2: the ones argued from the busiest worker's load
    per stage (`busiest[s]` micro-batches), the only ones a routing changes."""
    costs = job.costs
    S = job.stages
    hop = stage_hops(costs, S)
    f, b, w = costs.forward, costs.backward_input, costs.backward_weight
    best = Bound(0.0, "")
    capacity = [holds(costs, s, busiest[s]) for s in range(S)]

    idle, stretch = [0.0] * S, [0.0] * S
    for s in range(S):
        n = busiest[s]
        k = capacity[s]
        held = min(k, n)
        chain = chain_below(costs, hop, s)
        idle[s] = forced_idle(costs, s, n, k, chain)
        value = n * (f[s] + b[s] + w[s]) + costs.allreduce[s] + costs.optimizer[s] + idle[s]
        if value > best.value_ms:
            best = Bound(value, f"work+fill+drain at stage {s}: {n} micro-batches on its busiest "
                                f"worker, {idle[s]:.3f} ms forced idle")
        # 3. Memory-time: first F start -> last B end holds n windows of >= F + chain + B each, at
        # most k at once; and first F start -> last W end holds a MB for >= F + chain + B and aw MB
        # for >= W per micro-batch, at most L MB at once.
        round_trip = f[s] + chain + b[s]
        paced = paced_stage(costs, s, n, k, round_trip)
        stretch[s] = first_op_to_last_b(costs, s, n, k, chain, paced)
        limit = costs.memory_limit_mb + MEMORY_TOLERANCE_MB
        mb_time = n * (costs.activation[s] * round_trip + costs.activation_w[s] * w[s])
        tail = costs.allreduce[s] + costs.optimizer[s]
        value = max(stretch[s] + w[s], mb_time / limit if limit > 0 else 0.0, paced.last_w_end) + tail
        if value > best.value_ms:
            best = Bound(value, f"memory-time at stage {s}: {n} micro-batches, {held} held at once")

    for a in range(S):
        tail = w[a] + costs.allreduce[a] + costs.optimizer[a]
        there = back = 0.0  # forward chain a..b-1 with hops, and the way back including B_a
        for end_stage in range(a + 1, S):
            there += f[end_stage - 1] + hop[end_stage - 1]
            back += b[end_stage - 1] + hop[end_stage - 1]
            # stretch: the busiest stage-b worker's first op -> last B end (work, forced idle and
            # memory-time as in 1 and 3; see docs/notes/bounds.md).
            value = there + stretch[end_stage] + back + tail
            if value > best.value_ms:
                best = Bound(value, f"round trip from stage {a} to stage {end_stage}")
    return best
