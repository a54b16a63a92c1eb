"""Bound 7 (docs/notes/bounds.md, section 8): the first wave meets too few slots at the next stage.

All alive workers of stage s start their all-reduce together and run the same optimizer, so each
iteration's ops of stage s lie in one window [E, E + P - AR_s - OPT_s] common to the stage. When a
stage-s worker holds one micro-batch at a time and cannot start an F while another waits for its W
(k_s = 1 and a_s + aw_s > L: bound 4's one-at-a-time case), its whole iteration is one chain, and
its first micro-batch reaches stage s + 1 at the earliest at E + F_s + hop_s.

Stage s + 1 holds at most `slots` = alive_{s+1} x k_{s+1} micro-batches between F start and B end
at once, and none of this iteration's can end its B before T = E + F_s + hop_s + RT, RT = F_{s+1}
+ B_{s+1} + the chain below (`rest`): at most `slots` micro-batches enter stage s + 1 before T. Each
stage-s worker that serves anything sends its own first micro-batch there, so at least
(serving workers - slots) of them enter at T or later, RT after the earliest entry, and the chain of
such a late worker is RT + hop_s - (its first hop) longer than bound 4's one-at-a-time term
n (F + chain + B + W) + tail. With N(P) and N_late(P) the most micro-batches a worker can serve on
time and late (bound 4's g with that term lengthened), P must let the stage's workers cover D x M
with the fewest late ones costing the least: the least such P is found by binary search as in
bound 4 (the covered count never falls as P grows: a worker that starts serving adds at least the
one late worker's loss it may cause).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from planner.bounds import MEMORY_TOLERANCE_MB, Bound, holds, stage_hops
from planner.bounds_sharing import least_covering, most_served, per_worker_bound
from planner.spec import JobSpec, StageCosts, Worker

Kind = tuple[int, Callable[[int], float], Callable[[int], float]]
"""(how many workers, g on time, g late) of one kind of stage-s worker."""


def one_at_a_time(costs: StageCosts, s: int, total: int) -> bool:
    """Whether a stage-s worker runs its micro-batches strictly one after another (bound 4)."""
    limit = costs.memory_limit_mb + MEMORY_TOLERANCE_MB
    return holds(costs, s, total) == 1 and costs.activation[s] + costs.activation_w[s] > limit


def _late(costs: StageCosts, s: int, chain: float, delay: float, on_time: Callable[[int], float],
          ) -> Callable[[int], float]:
    """g of a worker whose first micro-batch enters stage s + 1 `delay` after its earliest."""
    per = costs.forward[s] + chain + costs.backward_input[s] + costs.backward_weight[s]
    tail = costs.allreduce[s] + costs.optimizer[s]
    return lambda n: max(on_time(n), n * per + tail + delay) if n > 0 else on_time(n)


def _covers(kinds: list[Kind], slots: int, total: int, period: float) -> bool:
    on_time = [most_served(g, period, total) for _, g, _ in kinds]
    late = [most_served(g_late, period, total) for _, _, g_late in kinds]
    serving = sum(count for (count, _, _), n in zip(kinds, on_time, strict=True) if n > 0)
    must_be_late = max(0, serving - slots)
    covered = sum(count * n for (count, _, _), n in zip(kinds, on_time, strict=True))
    # The late ones are those that lose the least by it.
    for loss, count in sorted((n - m, count) for (count, _, _), n, m in zip(kinds, on_time, late, strict=True)
                              if n > 0):
        take = min(count, must_be_late)
        covered -= take * loss
        must_be_late -= take
    return covered >= total


def first_wave_bound(job: JobSpec, failed: tuple[Worker, ...] | list[Worker]) -> Bound:
    """Bound 7 over every stage that runs one micro-batch at a time and has more alive workers than
    the next stage has slots (module docstring); Bound(0.0, "") where none does."""
    costs = job.costs
    S, total = job.stages, job.pipelines * job.microbatches
    dead = set(map(tuple, failed))
    hop = stage_hops(costs, S)
    f, b = costs.forward, costs.backward_input
    best = Bound(0.0, "")
    for s in range(S - 1):
        alive = [p for p in range(job.pipelines) if (p, s) not in dead]
        slots = sum(1 for p in range(job.pipelines) if (p, s + 1) not in dead) * holds(costs, s + 1, total)
        if len(alive) <= slots or not one_at_a_time(costs, s, total):
            continue
        rest = sum(f[t] + b[t] for t in range(s + 1, S)) + 2 * sum(hop[s + 1:])
        cut = sum(1 for p in alive if (p, s + 1) in dead)
        kinds: list[Kind] = []
        for count, first_hop in ((cut, min(costs.cross_p2p[s], costs.cross_p2p[s + 1])),
                                 (len(alive) - cut, hop[s])):
            if count:
                chain = rest + 2 * first_hop
                g = per_worker_bound(costs, s, chain, total)
                kinds.append((count, g, _late(costs, s, chain, max(0.0, rest + hop[s] - first_hop), g)))
        # The least covering P is one of the on-time or late g values.
        value = least_covering([g for _, g, _ in kinds] + [g_late for _, _, g_late in kinds],
                               partial(_covers, kinds, slots, total), total)
        if value > best.value_ms:
            best = Bound(value, f"first wave at stage {s}: {len(alive)} workers one micro-batch at a "
                                f"time, {slots} slots at stage {s + 1}")
    return best
