"""Constructive planner: event-driven list scheduling over all workers at once.

Every worker, whenever it is free, picks among the ops whose inputs have arrived: B first (it is on
the critical path back to stage 0), then F if the micro-batch's activations fit in memory, then W
(movable, so it fills whatever gap is left, ZB-style). A policy adds the knobs worth a small grid
search (as Zero Bubble's own heuristic does): whether a W may start when it would delay a gradient
already on its way, and how many forwards a worker may run ahead of its backwards.

The schedule is made for one iteration with all workers free at time 0; its steady-state period is
measured afterwards by the simulator's replay of the op orders.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass

from planner.precedence import collective_ops, fed_by, needs
from planner.routing import Routing
from planner.spec import JobSpec
from planner.timeline import Op

_EPS = 1e-9
_INF = float("inf")


@dataclass(frozen=True, slots=True)
class Policy:
    """Knobs of the list scheduler."""

    w_tolerance: float | None = None
    """None: a W runs whenever nothing else can (greedy). A number x: a W runs only if it ends
    before the next expected input gradient arrives plus x times W's duration; otherwise the worker
    keeps itself free for that gradient (B is on the critical path, W can go anywhere later).
    "Expected" is the exact arrival when the sender has started, else the uncongested round trip
    from this worker's F; a forward input already on its way counts too (when the worker may run
    it). Memory pressure (an F waiting for room) always lets W run."""
    ahead_slack: int | None = 0
    """A stage-s worker may run at most `S - s + ahead_slack` forwards ahead of its input
    gradients (1F1B's warm-up depth plus slack; ZB-H1 uses 0). None: only memory bounds it. W's
    are not counted here, so deferred W's use whatever memory is left (as in ZB-H1)."""
    feed_bottleneck: bool = False
    """Workers at or above the deepest stage that took re-routed work may run ahead by the number of
    extra micro-batches the busiest peer took (on top of `S - s + slack`), so the overloaded peers
    never wait for forwards."""
    routing_rotation: int = 0
    """Which alive peer receives the first re-routed micro-batch (see `balanced_routing`)."""
    fill_round_trip: bool = False
    """The forward-ahead cap of stage s is instead the number of forwards that fit in its
    uncongested round trip, `ceil((F_s + round trip_s) / F_s) + ahead_slack` (ZB-H2's warm-up:
    with twice 1F1B's memory stage 0 fills its whole wait for the first gradient, and deeper stages
    run no more forwards than that, so the first gradients are not queued behind forwards)."""
    tail_forwards: int = 0
    """On the stages whose busiest worker carries the most micro-batches, a worker with at most
    this many forwards left runs them before its ready input gradients (and a W before an input
    gradient when only memory holds a forward back), whatever the forward-ahead cap. 0: off."""
    tail_upstream: bool = False
    """`tail_forwards` on every stage above the deepest busiest one too, so that the busiest
    stage's last forwards are fed as fast as it runs them."""
    paced_stage: int | None = None
    """None: off. s: at stage s a ready forward that fits runs before a ready input gradient, and a
    W that makes room for it too, so where memory paces the forwards each slot's next round trip
    starts as soon as its W frees it. At stage 0 the input gradients feed nothing upstream. At a
    deeper bottleneck stage they feed stage s - 1, whose round trips the bottleneck's own pace
    sets anyway (made-up 4 x 5 x 24 with stage 1 left to one worker, five held at once: 1219.6 ms
    B-first at best, 1143.8 paced, bound 1125.9; docs/notes/planner-issue8.md, AL)."""
    first_stage_spacing: float = 0.0
    """0: every stage-0 worker may start its forwards at once. x > 0: its first `fits(0)` forwards
    (as many as its memory holds) are released x cadences apart, a cadence being one uncongested
    stage-0 cycle (F, round trip, B) over those slots. Where memory paces stage 0, forwards started
    as one burst travel as one: they queue behind each other at every stage and their gradients
    come back together, so the last stage idles between bursts. Released a cadence apart they
    come back a cadence apart, and since each frees the slot of the next, the replayed orders keep
    the spacing every iteration (made-up 1 x 5 x 10 with three stage-0 slots: 277.2 ms with every
    grid policy, 262.4 spaced by 1.05 cadences; CP-SAT proves 255.6)."""
    forwards_first_upstream: bool = False
    """Stages above the bottleneck stage (the most work on its busiest worker) run a ready F that fits
    before a ready B. Their B's feed nothing the bottleneck needs, while a forward held back is one
    the bottleneck may starve for; B-first there makes the bottleneck fill its waits with W's, so
    its last B, and every gradient behind it, comes back later (made-up 8 x 7 x 18 with pipeline 7
    damaged at four stages, the survivors kept at stages 0 and 3: 561.5 -> 549.2 ms list-scheduled;
    docs/notes/planner-issue8.md, AI)."""
    forward_yield: float | None = None
    """None: off. x >= 0: at stages s >= 1, a ready forward that arrived across pipelines (its
    stage s - 1 ran on another pipeline's worker) waits when it would still be running (with its B,
    at the last stage, where the B follows at once) more than x ms after this pipeline's own next
    forward arrives: known once the own stage s - 1 worker has started it, else estimated as the
    own micro-batch's gradient sent back plus one upstream B, F and the hops (the upstream worker
    holding one micro-batch at a time). Where memory lets the stage-0 workers hold one micro-batch
    each, the uncut workers have no slack, and a peer that starts a cut worker's round trip when
    its own is due delays its own pipeline by that whole window (made-up 4 x 2 x 21, one stage-1
    worker dead, with a mix that keeps 18 micro-batches on the cut worker: 981.5 -> 949.0 ms)."""
    dynamic_routing: bool = False
    """Route each micro-batch at stages s >= 1 when its forward at s - 1 ends, to the alive peer
    expected to start it first (arrival over the hop, the peer's queued and held round trips and
    its memory), instead of `routing`'s fixed choice; stage 0 keeps `routing`. With one micro-batch
    in flight per worker the next stage's workers are a resource the round trips share: a fixed
    choice makes a forward wait for a busy peer while another is free."""

    @property
    def name(self) -> str:
        cap = "mem" if self.ahead_slack is None else f"S-s+{self.ahead_slack}"
        gaps = "greedy" if self.w_tolerance is None else f"yield{self.w_tolerance:g}"
        feed = ",feed" if self.feed_bottleneck else ""
        if self.fill_round_trip:
            cap = f"fill{self.ahead_slack or 0:+d}"
        dyn = ",dynamic" if self.dynamic_routing else ""
        tail = f",tail={self.tail_forwards}{'up' if self.tail_upstream else ''}" if self.tail_forwards else ""
        paced = {None: "", 0: ",paced"}.get(self.paced_stage, f",paced={self.paced_stage}")
        paced += ",fwd-first-up" if self.forwards_first_upstream else ""
        spaced = f",spaced={self.first_stage_spacing:g}" if self.first_stage_spacing else ""
        spaced += f",fwd-yield={self.forward_yield:g}" if self.forward_yield is not None else ""
        return f"W={gaps}{feed},cap={cap},rot={self.routing_rotation}{dyn}{tail}{paced}{spaced}"


def bottleneck_stage(job: JobSpec, routing: Routing) -> int:
    """The stage whose busiest worker has the most F + B + W work under `routing` (the deepest of
    equals): `Policy.forwards_first_upstream` changes the stages above it, so nothing when it is 0."""
    work = routing.busiest_work
    return max(range(job.stages), key=lambda s: (work[s], s))


def list_schedule(job: JobSpec, routing: Routing, policy: Policy = Policy()) -> list[Op]:
    """A valid schedule for one iteration (rules 1-6 hold by construction)."""
    costs = job.costs
    D, S, M = job.pipelines, job.stages, job.microbatches
    dead = set(routing.failed)
    alive = [(p, s) for p in range(D) for s in range(S) if (p, s) not in dead]
    fwd, bwd, wgt, act = costs.forward, costs.backward_input, costs.backward_weight, costs.activation
    act_w = costs.activation_w  # rule 6: held from B end to W end (act - act_w is freed at B end)
    rule3 = needs(costs, S)  # the one precedence graph (planner/precedence.py)
    hop_same = [rule3[("F", s + 1)].same_ms for s in range(S - 1)]
    limit = costs.memory_limit_mb + 1e-9
    busiest = routing.busiest
    slack = policy.ahead_slack
    caps = [D * M * 3 if slack is None else S - s + slack for s in range(S)]
    if policy.feed_bottleneck and routing.failed and slack is not None:
        # Stages down to the deepest overloaded one may run ahead by the extra micro-batches the
        # busiest peer took, so those peers never wait for forwards.
        deepest = max(s for _, s in routing.failed)
        extra = max(busiest) - M
        caps = [caps[s] + extra if s <= deepest else caps[s] for s in range(S)]

    # Uncongested time from the end of a micro-batch's F at stage s to its gradient arriving back.
    round_trip = [
        sum(fwd[t] + bwd[t] for t in range(s + 1, S)) + 2 * sum(hop_same[s:]) for s in range(S)
    ]
    if policy.fill_round_trip:
        caps = [max(1, math.ceil((fwd[s] + round_trip[s]) / fwd[s] - 1e-9) + (slack or 0)) for s in range(S)]
    yield_w = policy.w_tolerance
    # executor[s][mb] for mb = home * M + m
    executor = [[routing.executor(mb // M, mb % M, s) for mb in range(D * M)] for s in range(S)]

    n = D * S
    f_heap: list[list] = [[] for _ in range(n)]
    b_heap: list[list] = [[] for _ in range(n)]
    w_queue = [deque() for _ in range(n)]
    # The graph read forwards: who waits for a stage-s op of each kind, as (its queue, its stage,
    # same-pipeline delay, cross-pipeline delay); queue None is this worker's own W queue.
    queue_of = {"F": f_heap, "B": b_heap, "W": None}
    waiting_for = fed_by(rule3)
    out_f, out_b, out_w = (
        [[(queue_of[nd.kind], nd.stage, nd.same_ms, nd.cross_ms) for nd in waiting_for.get((k, s), ())]
         for s in range(S)] for k in ("F", "B", "W"))
    mem = [0.0] * n
    ahead = [0] * n
    expected: list[list] = [[] for _ in range(n)]  # (expected gradient arrival, mb) per worker
    known: list[set] = [set() for _ in range(n)]  # mbs whose gradient arrival time is known
    free_at = [0.0] * n
    remaining = [0] * n
    for p, s in alive:
        remaining[p * S + s] = 3 * routing.load[p][s]
    forwards_left = [routing.load[p][s] for p in range(D) for s in range(S)]
    # The last forwards first, on the stages whose busiest worker is the plan's busiest (under
    # dynamic routing a worker's load is not known in advance, so not there).
    tail_on = policy.tail_forwards if not policy.dynamic_routing else 0
    deepest_busy = max(s for s in range(S) if busiest[s] == max(busiest))
    tail = [tail_on if busiest[s] == max(busiest) or (policy.tail_upstream and s <= deepest_busy) else 0
            for s in range(S)]
    dynamic = policy.dynamic_routing
    paced = policy.paced_stage
    # Stages above this one run their ready forwards first (Policy.forwards_first_upstream).
    upstream_of = bottleneck_stage(job, routing) if policy.forwards_first_upstream else 0
    if dynamic:
        # Stages >= 1 are routed as the forwards arrive: loads unknown until then, so a worker is
        # never "done" early and a stage is done when all of its ops are.
        for p, s in alive:
            if s > 0:
                remaining[p * S + s] = _INF
        stage_ops_left = [3 * D * M] * S
        peers = [[p for p in range(D) if (p, s) not in dead] for s in range(S)]
        # Expected end of each round trip a worker holds or has been sent (B end estimate), by mb.
        window = [fwd[s] + round_trip[s] + bwd[s] for s in range(S)]
        holding: list[dict[int, float]] = [{} for _ in range(n)]
        fits = [costs.fits(s, D * M) or 1 for s in range(S)]
    events: list[tuple[float, int, int]] = []
    seq = 0
    forward_yield = policy.forward_yield
    own_gradient_sent = [-_INF] * n  # when each worker's last B for its own stage s - 1 worker ended
    own_next_forward = [0.0] + [hop_same[s - 1] + bwd[s - 1] + fwd[s - 1] + hop_same[s - 1]
                                for s in range(1, S)]
    for mb in range(D * M):
        q = executor[0][mb]
        wi = q * S
        # Interleave own and re-routed micro-batches by index at stage 0.
        f_heap[wi].append((0.0, mb % M, mb // M, mb))
    releases = _first_stage_releases(costs.fits(0, D * M) or 1, fwd[0] + round_trip[0] + bwd[0],
                                     policy.first_stage_spacing)
    for p, s in alive:
        if s == 0:
            heap = f_heap[p * S]
            if releases:
                heap.sort()  # the worker's own order; the k-th forward waits for releases[k]
                heap[:] = [(releases[min(k, len(releases) - 1)], *entry[1:]) for k, entry in enumerate(heap)]
                for at in releases[1:len(heap)]:
                    events.append((at, seq, p * S))
                    seq += 1
            heapq.heapify(heap)
            events.append((0.0, seq, p * S))
            seq += 1
    heapq.heapify(events)

    ops: list[Op] = []
    # Workers with work left, per stage (an alive worker a routing gives nothing still all-reduces:
    # its stage's collectives go out when the last worker with work is done).
    stage_left = [sum(1 for p in range(D) if (p, s) not in dead and remaining[p * S + s]) for s in range(S)]
    stage_done = [0.0] * S
    push = heapq.heappush
    pop = heapq.heappop

    # One worker tuple per worker and one micro-batch tuple per micro-batch, shared by the ops
    # (and no divmod per event).
    worker_of = [divmod(wi, S) for wi in range(n)]
    mb_of = [divmod(mb, M) for mb in range(D * M)]
    while events:
        t, _, wi = pop(events)
        busy_until = free_at[wi]
        if busy_until > t + _EPS or remaining[wi] == 0:
            continue
        if busy_until > t:  # never start inside the previous op, even by rounding (max(t, free))
            t = busy_until
        worker = worker_of[wi]
        q, s = worker
        bh, fh, wq = b_heap[wi], f_heap[wi], w_queue[wi]
        kind = None
        # The last forwards first: this worker's last B is at least its last F's round trip after
        # that F, so each B run before the last F lengthens the stretch to it (bound 2's drain).
        tail_first = tail[s] and forwards_left[wi] <= tail[s] and fh and fh[0][0] <= t + _EPS
        if tail_first and mem[wi] + act[s] <= limit:
            kind, mb = "F", pop(fh)[-1]
        elif tail_first and wq and act_w[s] > 0:  # only memory holds the forward back
            kind, mb = "W", wq.popleft()
        elif (s < upstream_of or s == paced) and fh and fh[0][0] <= t + _EPS and ahead[wi] < caps[s] \
                and (mem[wi] + act[s] <= limit or (wq and mem[wi] - act_w[s] + act[s] <= limit)):
            kind, mb = ("F", pop(fh)[-1]) if mem[wi] + act[s] <= limit else ("W", wq.popleft())
        elif bh and bh[0][0] <= t + _EPS:
            kind, mb = "B", pop(bh)[-1]
        else:
            f_ready = bool(fh) and fh[0][0] <= t + _EPS
            f_room = mem[wi] + act[s] <= limit
            held = _INF  # when a held-back forward's own rival is due
            if forward_yield is not None and s > 0 and f_ready and f_room and executor[s - 1][fh[0][-1]] != q:
                own = [e[0] for e in fh if e[0] > t + _EPS and executor[s - 1][e[-1]] == q]
                due = min(own) if own else own_gradient_sent[wi] + own_next_forward[s]
                if due > t + _EPS and t + fwd[s] + (bwd[s] if s == S - 1 else 0.0) > due + forward_yield:
                    f_ready, held = False, due  # keep free for the own forward (a W may still fit)
                    push(events, (due, seq, wi))
                    seq += 1
            if f_ready and f_room and ahead[wi] < caps[s]:
                kind, mb = "F", pop(fh)[-1]
            elif wq:
                if yield_w is not None and not (f_ready and not f_room):
                    ex, kn = expected[wi], known[wi]
                    while ex and (ex[0][1] in kn or ex[0][0] <= t):
                        pop(ex)  # arrival now known, or late (congested): stop waiting on the estimate
                    next_b = min(bh[0][0] if bh else _INF, ex[0][0] if ex else _INF)
                    if fh and not f_ready and ahead[wi] < caps[s]:
                        next_b = min(next_b, fh[0][0] if held == _INF else held)
                    if t + wgt[s] > next_b + yield_w * wgt[s] + _EPS:
                        push(events, (next_b, seq, wi))  # stay free for the input that is due
                        seq += 1
                        continue
                kind, mb = "W", wq.popleft()
        if kind is None:
            continue  # idle until the next arrival wakes this worker
        microbatch = mb_of[mb]
        home, m = microbatch
        if kind == "F":
            end = t + fwd[s]
            if dynamic and s > 0:
                holding[wi][mb] = t + window[s]  # the actual start replaces the estimate
            mem[wi] += act[s]
            ahead[wi] += 1
            forwards_left[wi] -= 1
            if yield_w is not None and s < S - 1:  # (expected and known are read only to yield)
                push(expected[wi], (end + round_trip[s], mb))
            outs = out_f[s]
        elif kind == "B":
            end = t + bwd[s]
            if dynamic and s > 0:
                holding[wi].pop(mb, None)
            if forward_yield is not None and s > 0 and executor[s - 1][mb] == q:
                own_gradient_sent[wi] = end
            mem[wi] -= act[s] - act_w[s]  # released at `end`, before this worker's next op starts
            ahead[wi] -= 1
            outs = out_b[s]
        else:
            end = t + wgt[s]
            mem[wi] -= act_w[s]
            outs = out_w[s]
        for queue, ts, same_ms, cross_ms in outs:
            if queue is None:
                wq.append(mb)  # this worker's own W, ready once the B ends
                continue
            if dynamic and kind == "F" and queue is f_heap:
                dq = executor[ts][mb] = _earliest_peer(
                    peers[ts], ts, S, q, end, same_ms, cross_ms, holding, fits[ts], free_at, window[ts])
                dwi = dq * S + ts
                start = _room(holding[dwi], fits[ts], end + (same_ms if dq == q else cross_ms))
                holding[dwi][mb] = start + window[ts]
            else:
                dq = executor[ts][mb]
                dwi = dq * S + ts
            arrival = end + (same_ms if dq == q else cross_ms)
            push(queue[dwi], (arrival, m, home, mb))
            if yield_w is not None and queue is b_heap:
                known[dwi].add(mb)
            if dwi != wi:  # this worker wakes at `end` anyway
                push(events, (arrival, seq, dwi))
                seq += 1
        ops.append(Op(worker, kind, microbatch, t, end))
        free_at[wi] = end
        push(events, (end, seq, wi))
        seq += 1
        remaining[wi] -= 1
        if dynamic:
            stage_done[s] = max(stage_done[s], end)
            stage_ops_left[s] -= 1
            if stage_ops_left[s] == 0:
                ops.extend(collectives(job, s, dead, stage_done[s]))
                for p in peers[s]:
                    remaining[p * S + s] = 0
        elif remaining[wi] == 0:
            stage_done[s] = max(stage_done[s], end)
            stage_left[s] -= 1
            if stage_left[s] == 0:
                ops.extend(collectives(job, s, dead, stage_done[s]))
    if any(remaining):
        stuck = [divmod(i, S) for i, r in enumerate(remaining) if r]
        raise RuntimeError(f"list scheduler stalled with work left on {stuck[:4]}")
    return ops


def _first_stage_releases(slots: int, cycle_ms: float, spacing: float) -> list[float]:
    """When a stage-0 worker's first `slots` forwards may start (`Policy.first_stage_spacing`);
    later forwards wait for the last of these too (memory holds them back anyway). Empty: no
    spacing."""
    if spacing <= 0 or slots < 2:
        return []
    return [k * spacing * cycle_ms / slots for k in range(slots)]


def _earliest_peer(peers: list[int], s: int, S: int, q: int, end: float, same_ms: float,
                   cross_ms: float, holding: list[dict[int, float]], fits: int, free_at: list[float],
                   window: float) -> int:
    """The stage-s peer expected to start a forward that leaves pipeline q's stage s - 1 at `end`
    first: its arrival over the hop, then room among the round trips the peer holds or was sent
    (each expected to end `window` after its start; `fits` at once). Ties: the same pipeline,
    then the peer holding fewer."""
    best, best_key = peers[0], None
    for p in peers:
        wi = p * S + s
        held = holding[wi]
        start = _room(held, fits, max(end + (same_ms if p == q else cross_ms), free_at[wi]))
        key = (start, p != q, len(held), p)
        if best_key is None or key < best_key:
            best, best_key = p, key
    return best


def _room(held: dict[int, float], fits: int, start: float) -> float:
    """`start`, or later: when a worker holding `held` round trips (their expected ends) has room
    for one more of the `fits` it can hold at once."""
    if len(held) < fits:
        return start
    return max(start, sorted(held.values())[len(held) - fits])


def collectives(job: JobSpec, s: int, dead: set, at: float) -> list[Op]:
    """Rule 5's ops of stage s on its alive workers, in pipeline order, starting at `at`."""
    alive = [(p, s) for p in range(job.pipelines) if (p, s) not in dead]
    return collective_ops(job.costs, s, alive, at)
