"""Bound 11 (docs/notes/bounds.md, section 12): the first gradients queue at a narrower stage below.

Bound 1 lets every stage-t worker's first round trip go down and back at the uncongested pace. When
stage t + 1 has fewer survivors than stage t (a failure below the bottleneck), the stage-t workers'
first round trips all need a stage-(t + 1) worker at the same time, early in the iteration, and
some stage-(t + 1) worker serves two or more of them one after the other: the last of those
gradients comes back later than bound 1 assumes, and its stage-t worker has only k_t forwards to
fill the wait with. A later start does not help it: stage t all-reduces together (rule 5), so a
worker that starts late only moves its idle to the others.

With A = alive_t > A' = alive_{t + 1}, every stage-t worker serving n = D x M / A micro-batches
(the argument needs even loads; a worker with more already costs (n + 1)(F_t + B_t + W_t) + AR_t +
OPT_t), a_x the first F start of stage-t worker x, a the least of them, R_x the start of x's first
B, T the all-reduce start, h the least hop between t and t + 1, k = min(k_t, n):
- x runs only forwards before R_x (no W without a B), at most k of them, so it idles at least
  R_x - a_x - k F_t there; with bound 1's drain after its last F (disjoint when n > k):
  T >= a_x + n (F_t + B_t + W_t) + R_x - a_x - k F_t + drain.
- The worker that starts at a spans T + AR_t + OPT_t - a <= P. With G = P - n (F_t + B_t + W_t) -
  AR_t - OPT_t - drain: R_x <= a + k F_t + G for every x.
- x's first B is that of some micro-batch it forwarded, a different one for each x. That micro-batch
  reached stage t + 1 at >= a + F_t + h and its B there ended by R_x - h: A micro-batches, each
  with its F and B at stage t + 1 (F' and B', c' the least round trip below t + 1 between them) in
  the window [a + F_t + h, a + k F_t + G - h], of length L = (k - 1) F_t + G - 2h. Some
  stage-(t + 1) worker serves q = ceil(A / A') of them, and its F's and B's do not overlap:
  L >= q (F' + B'). More: each of the q F's there ends at least F' after the window opens and
  each B starts at least c' after its F ends, so the q-th F to run ends >= q F' in and its B ends
  >= q F' + c' + B' in, while the q B's, one after another from >= F' + c' in, end >= F' + c' +
  q B' in: L >= F' + c' + B' + (q - 1) max(F', B') (a round trip below u with the others' F's
  queued before it or their B's after it; the window is what all q share, so which of them waits
  does not matter).
So P >= n (F_t + B_t + W_t) + AR_t + OPT_t + drain + max(0, max(q (F' + B'), F' + c' + B' +
(q - 1) max(F', B')) + 2h - (k - 1) F_t). With q = 1 that is bound 1.

The same holds at any deeper stage u with fewer survivors than t: the micro-batches pass the
stages between on the way down and back, so the window there is shorter by sum_{t<v<u}(F_v + B_v)
and the hops between (F', B', c' and h become stage u's, the hops summed from t to u).
"""

from __future__ import annotations

from planner.bounds import (
    Bound,
    alive_per_stage,
    chain_below,
    drain_idle,
    holds,
    stage_hops,
    worker_span,
)
from planner.spec import JobSpec, StageCosts, Worker


def queued_fill_bound(job: JobSpec, failed: tuple[Worker, ...] | list[Worker]) -> Bound:
    """Bound 11 over every stage t with a whole number of micro-batches per survivor and every
    stage u below it with fewer survivors; Bound(0, "") where no pair qualifies."""
    costs = job.costs
    S, total = job.stages, job.pipelines * job.microbatches
    alive = alive_per_stage(job, failed)
    if min(alive) == 0:
        return Bound(0.0, "")  # a stage without survivors: no plan at all
    hop = stage_hops(costs, S)
    best = Bound(0.0, "")
    for t in range(S - 1):
        narrower = [u for u in range(t + 1, S) if alive[u] < alive[t]]
        if not narrower or total % alive[t]:
            continue  # the argument needs a queue below and even loads at t
        n = total // alive[t]
        k = min(holds(costs, t, n), n)
        chain = chain_below(costs, hop, t)
        drain = drain_idle(costs, t, n, k, chain)
        # Uneven loads put n + 1 on some worker: its work alone is then the bound.
        uneven = (n + 1) * (costs.forward[t] + costs.backward_input[t] + costs.backward_weight[t]) \
            + costs.allreduce[t] + costs.optimizer[t]
        for u in narrower:
            queued = -(-alive[t] // alive[u])  # first round trips one stage-u worker serves
            value = min(worker_span(costs, t, n, k, _queued_chain(costs, hop, t, u, queued), drain),
                        uneven)
            if value > best.value_ms:
                best = Bound(value, f"first gradients queued below stage {t}: {alive[t]} workers there "
                                    f"share {alive[u]} at stage {u}")
    return best


def _queued_chain(costs: StageCosts, hop: list[float], t: int, u: int, queued: int) -> float:
    """Bound 1's round trip below stage t when the last of `queued` first round trips a stage-u
    worker serves must also wait for the F and B of the others there: the stages between t and u
    (F, B and the hops) on the way, then at stage u `queued` x (F_u + B_u), or one round trip
    below u with the other F's before it or the other B's after it (module docstring)."""
    f, b = costs.forward[u], costs.backward_input[u]
    between = sum(costs.forward[v] + costs.backward_input[v] for v in range(t + 1, u)) + 2 * sum(hop[t:u])
    return max(between + queued * (f + b),
               between + f + chain_below(costs, hop, u) + b + (queued - 1) * max(f, b))
