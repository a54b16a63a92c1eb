"""Bound 12 (docs/notes/bounds.md, section 13): a survivor's round trips priced by its own chain.

Where failures leave stage s < S - 1 with fewer workers than pipelines, its busiest survivor (p, s)
runs n >= ceil(D x M / alive_s) micro-batches (all of them where one is left) and, short of memory,
its period is set by its round trips (bound 6's recurrence), which bound 6 prices at the least hop.
Only a micro-batch served below s by pipeline p's workers alone gets that: one that crosses
pipelines at any boundary t pays the cross-pipeline hop there both ways, at least
Delta = min_t 2 (least cross hop_t - least hop_t) more. The fast ones all run their F, B and W on
each (p, t), t > s: with c of them the period is at least g(c) = max_t c (F_t + B_t + W_t) + AR_t
+ OPT_t.

Bound 6's inequalities, taken one at a time, read t_j >= t_i + (F + chain) + off_i + counts x costs,
with t_i the i-th F start, x the number held at t_j, and off_i a lower bound on the extra of every
micro-batch of F index >= i: Delta for a slow i where Delta <= F_s (the next F starts at least F_s
later, so a fast one after it is not released earlier); where Delta > F_s, a fast micro-batch l
shadows the slow ones just before it by (Delta - (l - i) F_s)^+. Any distribution over chains of
these inequalities (a unit flow in their DAG, `priced_last_w_end`) bounds the last W end by its
expected constants plus sum_i mu_i off_i, whatever the schedule picks: x at each F (a minimum per F
over x) and which c micro-batches are fast (the c largest shadowed weights, linear with theta and
z). Maximised over the flow, that is an LP, B(c). B(0) is bound 6 at round trip + Delta itself; B
falls and g rises in c, so the period is at least min_c max(B(c) + AR_s + OPT_s, g(c)).
"""

from __future__ import annotations

import math

from planner.bounds import Bound, alive_per_stage, chain_below, holds, paced_stage, pending_w_cap, stage_hops
from planner.bounds_sharing import crossing_cost
from planner.spec import JobSpec, StageCosts, Worker

PRICED_MAX_MICROBATCHES = 256
"""Above this many micro-batches on the busiest survivor the LP (about 13 n columns) is not built:
one solve takes ~0.04 s at n = 95 and ~0.2 s at 256, and the bracket needs a few of them (0.6-0.9 s
in all at 256)."""

VIOLATION_MAX = 1e-6
"""A solution outside some row or column bound by more than this is not trusted (no bound); below
it the value is lowered by what the violation can cost (`priced_last_w_end`). GLOP's solutions were
off by 0 to 3e-9 on the made-up cases."""


def own_chain_period(costs: StageCosts, s: int, stages: int, fast: int) -> float:
    """Least period with `fast` micro-batches served below stage s by one pipeline's workers alone:
    each of them runs F, B and W there, then its all-reduce and step."""
    return max(fast * (costs.forward[t] + costs.backward_input[t] + costs.backward_weight[t])
               + costs.allreduce[t] + costs.optimizer[t] for t in range(s + 1, stages))


def priced_last_w_end(costs: StageCosts, s: int, n: int, k: int, round_trip: float, extra: float,
                      fast: int, shadowed: bool) -> float | None:
    """The largest expected last-W end (from the first F start) over distributions on chains of
    bound 6's inequalities, each slow micro-batch's release `extra` later, the schedule choosing how
    many it holds at each F and which `fast` micro-batches do not cross. `shadowed`: charge a fast
    one's shadow on the slow ones before it (Delta - d F)^+; else price a slow one at min(Delta, F).
    None when the solver does not return a trusted optimum."""
    from ortools.linear_solver import pywraplp  # loaded only where a lone worker is priced

    f, b, w = costs.forward[s], costs.backward_input[s], costs.backward_weight[s]
    held = min(k, n)
    pending = [pending_w_cap(costs, s, x + 1, n) for x in range(held)]
    xs = [x for x in range(held) if pending[x] >= 0]
    release = round_trip - b
    slopes = (b + w + f, b + f, b + w, b)  # the four mixes of bound 6 (B + W + F, B + F, B + W, B)
    solver = pywraplp.Solver.CreateSolver("GLOP")
    infinity = solver.infinity()
    leaving: dict[tuple, list] = {}
    arriving: dict[tuple, list] = {}
    objective = []

    def arc(u: tuple, v: tuple, weight: float | None = None):
        var = solver.NumVar(0.0, 1.0, "")
        leaving.setdefault(u, []).append(var)
        arriving.setdefault(v, []).append(var)
        if weight is not None:
            objective.append(weight * var)
        return var

    start, sink = ("t", 0), ("end",)
    entering: list[list] = [[] for _ in range(n)]
    for j in range(1, n):
        arc(("t", j - 1), ("t", j), f)  # one machine: F after F
    for m in range(n):
        for mix, slope in enumerate(slopes):
            # The running maximum of t_i + off_i - i x slope (bound 6's prefix maxima) as a chain.
            entering[m].append(arc(("t", m), ("max", mix, m), -m * slope))
            if m:
                arc(("max", mix, m - 1), ("max", mix, m), 0.0)

    def mix_weight(mix: int, backs: int, weights: int, forwards: int) -> float:
        # A count left out, or negative, only lowers a term: each mix holds for every i <= backs - 1.
        return (release + backs * b + (weights * w if mix in (0, 2) else 0.0)
                + (forwards * f if mix in (0, 1) else 0.0))

    for j in [*range(held, n), None]:  # None: the last W end
        m = n - 1 if j is None else j - held  # i <= j - x - 1 for every x the memory allows
        target = sink if j is None else ("t", j)
        exits = [(mix, arc(("max", mix, m), target)) for mix in range(4)]
        tau = solver.NumVar(-infinity, infinity, "")
        objective.append(tau)
        for x in [None] if j is None else xs:
            counts = (n, n, n - held) if j is None else (j - x, j - x - pending[x], j - held)
            solver.Add(tau <= sum(mix_weight(mix, *counts) * var for mix, var in exits))
    # Nodes in the order they were made (not a set's, which follows the string hash seed): the same
    # LP in every process, so the same solution and bound.
    for v in dict.fromkeys([*leaving, *arriving]):
        need = 1 if v == start else (-1 if v == sink else 0)
        solver.Add(sum(leaving.get(v, [])) - sum(arriving.get(v, [])) == need)
    mu = [sum(entry) for entry in entering]
    if shadowed:
        shadow = [(d, extra - d * f) for d in range(1, n) if extra - d * f > 0]
        nu = [extra * mu[i] + sum(cut * mu[i - d] for d, cut in shadow if i >= d) for i in range(n)]
        priced = extra * sum(mu)
    else:
        cheap = min(extra, f)
        nu = [cheap * mu[i] for i in range(n)]
        priced = cheap * sum(mu)
    theta = solver.NumVar(0.0, infinity, "")
    over = [solver.NumVar(0.0, infinity, "") for _ in range(n)]
    for i in range(n):
        solver.Add(over[i] >= nu[i] - theta)
    # The fast ones take away at most the `fast` largest nu_i: fast x theta + sum (nu_i - theta)^+.
    solver.Maximize(sum(objective) + priced - fast * theta - sum(over))
    if solver.Solve() != pywraplp.Solver.OPTIMAL:
        return None
    violation = _largest_violation(solver)
    if violation > VIOLATION_MAX:
        return None
    value = solver.Objective().Value()
    # At a point off by v in some rows, the chains' argument loses at most v per row times the
    # largest potential it multiplies (a node's time, within the last W end + the extra), and the
    # last W end is at least the value less that: taken off, so the bound stays sound.
    size = solver.NumVariables() + solver.NumConstraints()
    kept = value - violation * size * (abs(value) + extra + 1.0) - 1e-9 * abs(value)
    # Down to whole nanoseconds: the same LP solved in another order of calls can differ in its
    # last bits, and `routing_bound` must equal `lower_bound` with a routing's loads exactly.
    return math.floor(kept * 1e6) / 1e6


def _largest_violation(solver) -> float:
    """How far the solver's solution is outside any row or column bound (0 when exactly feasible)."""
    worst = 0.0
    for row, activity in zip(solver.constraints(), solver.ComputeConstraintActivities(), strict=True):
        worst = max(worst, row.lb() - activity, activity - row.ub())
    for column in solver.variables():
        value = column.solution_value()
        worst = max(worst, column.lb() - value, value - column.ub())
    return worst


def _stage_bound(job: JobSpec, dead: set[Worker], s: int, floor_ms: float) -> float:
    """Bound 12 at stage s: its busiest survivor runs n >= ceil(D x M / alive) micro-batches, and the
    first n of them (in F order) obey the chains of a worker with n (memory held and pending counted
    among those started, all their B's and W's before its last W end); which survivor is busiest is
    the plan's choice, so the least over survivors, the one whose own chain below is whole."""
    costs, S = job.costs, job.stages
    survivors = [q for q in range(job.pipelines) if (q, s) not in dead]
    n = -(-job.pipelines * job.microbatches // len(survivors))
    hop = stage_hops(costs, S)
    # A round trip that crosses pipelines at some boundary below s pays the cross hop both ways there.
    extra = crossing_cost(costs, hop, s, S - 1)
    if extra <= 0:
        return 0.0
    k = holds(costs, s, n)
    round_trip = costs.forward[s] + chain_below(costs, hop, s) + costs.backward_input[s]
    tail = costs.allreduce[s] + costs.optimizer[s]
    all_slow = paced_stage(costs, s, n, k, round_trip + extra).last_w_end + tail
    if not any(all((q, t) not in dead for t in range(s + 1, S)) for q in survivors):
        return all_slow  # every micro-batch crosses somewhere: bound 6 at the longer round trip
    if all_slow <= floor_ms or n > PRICED_MAX_MICROBATCHES or n <= 1:
        return 0.0  # (n <= 1: nothing to chain; `paced_stage` gave 0 there too)
    solved: dict[int, float] = {0: all_slow}

    def priced(fast: int) -> float | None:
        if fast not in solved:
            values = [priced_last_w_end(costs, s, n, k, round_trip, extra, fast, shadowed)
                      for shadowed in ((True, False) if extra > costs.forward[s] else (True,))]
            if any(v is None for v in values):
                return None
            solved[fast] = max(values) + tail
        return solved[fast]

    def own(fast: int) -> float:
        return own_chain_period(costs, s, S, fast)

    # The least fast count c* whose own chain is at least as long as its priced round trips (n + 1
    # when there is none); below c* the priced round trips bind, from c* on the own chain. B(c) lies
    # between B(n) and B(0), so c* lies between where the own chain passes those two: a bracket of
    # (B(0) - B(n)) / (the own chain's F + B + W) counts, a few LPs.
    fewest = priced(n)
    if fewest is None:
        return 0.0
    low = next((c for c in range(n + 1) if own(c) >= fewest), n + 1)
    high = next((c for c in range(low, n + 1) if own(c) >= all_slow), n + 1)
    while low < high:
        mid = (low + high) // 2
        value = priced(mid)
        if value is None:
            return 0.0
        if own(mid) >= value:
            high = mid
        else:
            low = mid + 1
    if low == 0:
        return own(0)
    below = priced(low - 1)
    if below is None:
        return 0.0
    return below if low > n else min(own(low), below)


def priced_round_trip_bound(job: JobSpec, failed: tuple[Worker, ...] | list[Worker],
                            floor_ms: float = 0.0) -> Bound:
    """Bound 12 over every stage above the last that lost workers (module docstring); Bound(0, "")
    where none did, or where it cannot beat `floor_ms` (the other bounds' best)."""
    if job.pipelines < 2:
        return Bound(0.0, "")
    dead = set(map(tuple, failed))
    alive = alive_per_stage(job, failed)
    best = Bound(0.0, "")
    for s in range(job.stages - 1):
        if not 0 < alive[s] < job.pipelines:
            continue
        value = _stage_bound(job, dead, s, max(floor_ms, best.value_ms))
        if value > best.value_ms:
            best = Bound(value, f"round trips priced at stage {s}: its busiest survivor's own pipeline "
                                "below serves only so many, the rest cross pipelines")
    return best
