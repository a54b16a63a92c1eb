"""Bound 7 (docs/notes/bounds.md, section 8): the first and the last wave meet too few slots at the
next stage.

All alive workers of stage s start their all-reduce together and run the same optimizer, so each
iteration's ops of stage s lie in one window [E, A] common to the stage, A + AR_s + OPT_s <= E + P.
Where a stage-s worker holds one micro-batch at a time between F start and B end (k_s = 1), its
windows [F start, B end] follow one another, with the stage-(s + 1) window of each micro-batch
inside: its round trips are one chain from its first entry into stage s + 1 to its last exit.

Stage s + 1 holds at most `slots` = alive_{s+1} x k_{s+1} micro-batches between F start and B end
at once, and each such window lasts at least RT = F_{s+1} + B_{s+1} + the chain below (`rest`).
- First wave: no entry comes before E + F_s + hop_s, so none of this iteration's micro-batches
  leaves stage s + 1 before T = E + F_s + hop_s + RT, and at most `slots` enter before T.
- Last wave, the mirror: no exit comes after Z = A - hop_s - B_s - W_s (the micro-batch is still
  owed its hop back, its B and W at stage s), and each micro-batch that leaves after Z - RT is held
  just after Z - RT: at most `slots` leave after Z - RT.
Each worker sends its own first micro-batch and gets back its own last one, so at least
m = alive_s - slots workers enter late (at T or after) and at least m leave early (by Z - RT); a
worker that serves nothing may take either label, and one worker may take both. Each label makes
the worker's chain RT + hop_s - (its own first hop) longer (never less than 0) than bound 4's
chain term: n (F + chain + B) + W + tail, or n (F + chain + B + W) + tail when no W may wait beside
the next F (a_s + aw_s > L).

With N0(P), N1(P), N2(P) the most micro-batches a worker serves with no label, one and two (bound
4's g with the chain lengthened), P must let the stage's workers cover D x M with 2 m labels given
where they cost the fewest micro-batches. The covered count never falls as P grows, so the least
such P is one of the g values, found by bisection as in bound 4.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

from planner.bounds import MEMORY_TOLERANCE_MB, Bound, holds, stage_hops
from planner.bounds_sharing import least_covering, most_served, per_worker_bound
from planner.spec import JobSpec, StageCosts, Worker

Kind = tuple[int, Callable[[int], float], Callable[[int], float], Callable[[int], float]]
"""(how many workers, g with no label, g with one label, g with both) of one kind of stage-s worker."""


def one_at_a_time(costs: StageCosts, s: int, total: int) -> bool:
    """Whether a stage-s worker runs its micro-batches strictly one after another, F to W (bound 4)."""
    limit = costs.memory_limit_mb + MEMORY_TOLERANCE_MB
    return holds(costs, s, total) == 1 and costs.activation[s] + costs.activation_w[s] > limit


def _labelled(costs: StageCosts, s: int, total: int, chain: float, delay: float,
              on_time: Callable[[int], float]) -> Callable[[int], float]:
    """g of a worker whose chain of round trips is `delay` longer (late in, early out, or both)."""
    strict = one_at_a_time(costs, s, total)
    w = costs.backward_weight[s]
    per = costs.forward[s] + chain + costs.backward_input[s] + (w if strict else 0.0)
    tail = costs.allreduce[s] + costs.optimizer[s] + (0.0 if strict else w)  # the last W, at least
    return lambda n: max(on_time(n), n * per + tail + delay) if n > 0 else on_time(n)


def _labels_cost(count: int, one: int, both: int, labels: int) -> int:
    """The fewest micro-batches `count` like workers lose carrying `labels` labels (at most two
    each: one of each side), losing `one` with one label and `both` with two: b workers take two,
    labels - 2 b one, and the loss labels x one + b (both - 2 one) is linear in b."""
    doubles = labels // 2 if both <= 2 * one else max(0, labels - count)
    return (labels - 2 * doubles) * one + doubles * both


def _covers(kinds: list[Kind], slots: int, total: int, period: float) -> bool:
    served = [[most_served(g, period, total) for g in kind[1:]] for kind in kinds]
    labels = 2 * max(0, sum(count for count, *_ in kinds) - slots)
    covered = sum(kind[0] * n[0] for kind, n in zip(kinds, served, strict=True))
    # The labels go where they cost the fewest micro-batches: t to the first kind (cut workers, or
    # those on their own pipeline when none is cut), the rest to the second (a kind of none, if one).
    losses = [(kind[0], n[0] - n[1], n[0] - n[2]) for kind, n in zip(kinds, served, strict=True)]
    first, second = (losses + [(0, 0, 0)])[:2]
    lost = min(_labels_cost(*first, t) + _labels_cost(*second, labels - t)
               for t in range(max(0, labels - 2 * second[0]), min(labels, 2 * first[0]) + 1))
    return covered - lost >= total


def wave_bound(job: JobSpec, failed: tuple[Worker, ...] | list[Worker]) -> Bound:
    """Bound 7 over every stage that holds one micro-batch at a time and has more alive workers than
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
        if len(alive) <= slots or holds(costs, s, total) != 1:
            continue
        rest = sum(f[t] + b[t] for t in range(s + 1, S)) + 2 * sum(hop[s + 1:])
        cut = sum(1 for p in alive if (p, s + 1) in dead)
        kinds: list[Kind] = []
        for count, first_hop in ((cut, min(costs.cross_p2p[s], costs.cross_p2p[s + 1])),
                                 (len(alive) - cut, hop[s])):
            if count:
                chain = rest + 2 * first_hop
                g = per_worker_bound(costs, s, chain, total)
                delay = max(0.0, rest + hop[s] - first_hop)
                kinds.append((count, g, _labelled(costs, s, total, chain, delay, g),
                              _labelled(costs, s, total, chain, 2 * delay, g)))
        # The least covering P is one of the g values of some kind and label.
        value = least_covering([g for kind in kinds for g in kind[1:]],
                               partial(_covers, kinds, slots, total), total)
        if value > best.value_ms:
            best = Bound(value, f"first and last waves at stage {s}: {len(alive)} workers one "
                                f"micro-batch at a time, {slots} slots at stage {s + 1}")
    return best
