"""Bound 13 (docs/notes/bounds.md, section 14): a stage's memory tokens queue at a stage below.

Stage s's workers hold at most T = alive_s x k_s micro-batches between F start and B end at once
(k_s as in bound 3): T tokens in all. Every micro-batch also runs its F and B on one worker of a
stage j below (rule 1: its B where its F ran), and a stage-j worker runs its F's and B's one at a
time. When the tokens come back faster than stage j serves them, some wait there, and the token's
next micro-batch starts later. Bounds 3 and 6 price every token's round trip alone; this one prices
the queue.

Times from E, the start of stage s's window (every op of this iteration at stage s starts >= E; the
window ends at A with A + AR_s + OPT_s <= E + P, rule 5). With the least hops (`stage_hops`):
lead = F_s + the F's between s and j + the hops down, back = the B's between + the hops up + B_s
(bound 2's way there and back, `bounds_late.way_there_and_back`), sigma = F_j + B_j,
tau = F_j + chain_j + B_j (the least F_j start -> B_j end). Number this iteration's micro-batches
by their F start at stage j, f_1 <= f_2 <= ... <= f_N (N = D x M), and let g_(i) be the i-th
smallest of their B_j ends.

- Stage s runs its F's one at a time on each worker: of the i micro-batches that reach stage j
  first, some stage-s worker started ceil(i / alive_s) of them, the last >= E + (ceil(i / alive_s)
  - 1) F_s, so f_i >= lead + (ceil(i / alive_s) - 1) F_s.
- Stage j does too: of any alive_j + 1 of its F's two run on one worker, so f_i >= f_(i - alive_j)
  + F_j.
- The queue: of the i micro-batches with the earliest B_j ends, at least i - r + 1 started their F
  at j at f_r or later, and some stage-j worker runs ceil((i - r + 1) / alive_j) of them, F and B
  each, after f_r: g_(i) >= f_r + ceil((i - r + 1) / alive_j) sigma for every r <= i. And one of
  them is numbered i or later: g_(i) >= f_i + tau.
- The tokens: at the instant p = f_(i + T) - lead, every micro-batch numbered <= i + T has started
  its F at stage s (by f - lead) and holds a token until its B at s ends (>= its B_j end + back).
  At most T are held, so at least i of them have ended their B at s by p: g_(i) + back <= p, that
  is f_(i + T) >= g_(i) + lead + back.
- The last B_j end g_(N) is followed by the way back, B_s, W_s and the tail:
  P >= g_(N) + back + W_s + AR_s + OPT_s.

The largest over r is one running maximum per residue of r modulo alive_j (`_least_last_b_end`),
so a pair (s, j) costs N steps; pairs are tried while the steps stay within `STEP_BUDGET`.

Where it binds: stage s short of memory (few tokens) above a stage j whose F + B is a sizeable part
of the round trip, so that the first round's tokens, which all leave at the start of the iteration,
meet at j and come back sigma apart instead of F_s apart. On one pipeline (the fault-free plan's
job) the tokens cannot spread; with failures at s they spread over the other pipelines' workers at
j, and bound 6's per-worker recurrence is then usually the larger.
"""

from __future__ import annotations

from planner.bounds import Bound, alive_per_stage, chain_below, holds, stage_hops
from planner.bounds_late import way_there_and_back
from planner.spec import JobSpec, StageCosts, Worker

STEP_BUDGET = 400_000
"""Most recurrence steps (micro-batches x stage pairs) one call spends, about half a second. Pairs
are taken by stage s, then by stage j's F + B per survivor, largest first (the queue that binds
first), and the bound stops at the first pair that would go over: a 1024 x 16 x 64 job (65,536
micro-batches) with a memory limit gets six pairs, and a smaller bound is still a bound."""


def token_queue_bound(job: JobSpec, failed: tuple[Worker, ...] | list[Worker]) -> Bound:
    """Bound 13 over every stage s whose tokens are fewer than the micro-batches and every stage j
    below it; Bound(0, "") where none qualifies (or a stage has no survivors)."""
    costs = job.costs
    S, total = job.stages, job.pipelines * job.microbatches
    alive = alive_per_stage(job, failed)
    if min(alive) == 0:
        return Bound(0.0, "")
    hop = stage_hops(costs, S)
    best, steps = Bound(0.0, ""), 0
    for s in range(S - 1):
        tokens = alive[s] * holds(costs, s, -(-total // alive[s]))
        if tokens >= total:
            continue  # every micro-batch can hold a token at once: nothing waits for one
        tail = costs.backward_weight[s] + costs.allreduce[s] + costs.optimizer[s]
        for j in sorted(range(s + 1, S), key=lambda t: -_served(costs, t) / alive[t]):
            steps += total
            if steps > STEP_BUDGET:
                return best
            value = _least_last_b_end(costs, hop, s, j, alive[s], alive[j], tokens, total) + tail
            if value > best.value_ms:
                best = Bound(value, f"memory tokens of stage {s} ({tokens}) queued at stage {j} "
                                    f"({alive[j]} workers)")
    return best


def _served(costs: StageCosts, j: int) -> float:
    """sigma: a stage-j worker's F and B of one micro-batch."""
    return costs.forward[j] + costs.backward_input[j]


def _least_last_b_end(costs: StageCosts, hop: list[float], s: int, j: int, alive_s: int,
                      alive_j: int, tokens: int, total: int) -> float:
    """g_(N) + back of the module docstring: the least B end at stage s of the micro-batch that
    leaves stage j last, from E."""
    lead, back = way_there_and_back(costs, hop, s, j)
    f_s, f_j = costs.forward[s], costs.forward[j]
    sigma = _served(costs, j)
    tau = f_j + chain_below(costs, hop, j) + costs.backward_input[j]
    rate = sigma / alive_j
    starts, b_ends = [0.0] * (total + 1), [0.0] * (total + 1)  # 1-based f_i and g_(i)
    # queue[rho] = max over r = rho (mod alive_j), r <= i, of f_r - r rate + (the latest index
    # <= i with residue rho) rate: f_r + ceil((i - r + 1) / alive_j) sigma - sigma for that r. Only
    # the residue of i moves when i grows, and only upwards, so one running maximum holds them all.
    best_r = [float("-inf")] * alive_j
    queue = float("-inf")
    for i in range(1, total + 1):
        start = lead + (-(-i // alive_s) - 1) * f_s
        if i > alive_j:
            start = max(start, starts[i - alive_j] + f_j)
        if i > tokens:
            start = max(start, b_ends[i - tokens] + lead + back)
        starts[i] = start
        rho = i % alive_j
        best_r[rho] = max(best_r[rho], start - i * rate)
        queue = max(queue, best_r[rho] + i * rate)
        b_ends[i] = max(start + tau, queue + sigma, b_ends[i - 1])
    return b_ends[total] + back
