"""The constructive search: every heuristic candidate replayed, the best period kept.

Candidates, in the order tried: the fault-free plan (and Zero Bubble's greedy schedules) with
re-routed work inserted on the peers (at a damaged last stage also as F/B pairs after the peer's
own B),
the ReCycle paper's construction (1F1B kept, round-robin re-routing: `planner.paper_style`),
fault-free only: Zero Bubble's greedy (`planner.zb_greedy`) and warm-ups deeper than 1F1B's
(`planner.deep_warmup`),
Zero-Bubble-style sweeps of the balanced re-routing, dissolving the damaged pipelines, the dropped
job's own plan (relabelled), the survivors re-formed into chains (`lane_routing`), the
list-scheduling grid, the best list schedule re-swept, mixes (part of each damaged pipeline
dissolved) while the budget lasts, and list schedules that route each micro-batch at the next stage
as its forward arrives (`Policy.dynamic_routing`), where a stage is left to one worker its round
trips booked whole (`planner.trips`); last, with what is left of the budget, swaps of
which peer serves which moved micro-batch on the best list schedule's routing
(`planner.route_search`). Each is measured by the simulator's replay; a
replay that does not settle is recorded in `SearchInfo`.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import time
from array import array
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from planner.bounds import lower_bound, routing_bound
from planner.bounds_sharing import cut_worker_shares
from planner.deep_warmup import deep_warmup_candidates
from planner.dropping import dropped_job, relabel_dropped
from planner.first_stage_tail import first_stage_tail
from planner.heuristic import Policy, bottleneck_stage, list_schedule
from planner.paper_style import paper_style_schedule
from planner.route_search import search_routing
from planner.routing import (
    Routing,
    balanced_routing,
    dissolving_routing,
    kept_stage_sets,
    lane_routing,
    mixed_routing,
    routing_of,
    stage_mixed_routing,
)
from planner.simulator import ReplayError, ReplayReport, replay
from planner.spec import JobSpec, Worker
from planner.sweep import SweepPolicy, insertion_orders, sweep_schedule
from planner.timeline import Op, orders_of
from planner.trips import TRIPS_BUDGET_SHARE, trip_candidates, trips_apply
from planner.zb_greedy import zb_greedy_candidates, zb_greedy_templates

HEURISTIC_GRID_MAX_OPS = 60_000
"""Above this many F/B/W ops only the default policy runs (the 3 s bar at 32 x 16 x 64)."""
ZB_TEMPLATES = 2
"""Zero Bubble greedy schedules (distinct, least period first) the re-routed work is also inserted
into, besides the fault-free plan (notes AU)."""
INSERTION_SEARCH_SHARE = 0.5
"""Share of the budget left at the routing search that the swaps judged by an insertion take, where
an insertion is the best candidate (the list-judged search gets the rest)."""
MIXES_ALWAYS_MAX_OPS = 3_000
"""Up to this many F/B/W ops every mix is tried whatever the budget (deterministic on small jobs)."""
MIX_LIST_POLICIES = 6
"""List policies tried on each mix whose `keep` comes from bound 4 (the grid's first, most often
winning ones)."""
NEAR_WHOLE_KEEPS = 4
"""Mixes list-scheduled that keep all but one to this many of each damaged pipeline's micro-batches
(made-up 6 x 7 x 19, stage 0 holding four of nineteen, a cross-pipeline hop 14 times the
same-pipeline one; seed 88's three failure sets, 10 s plans 447.9 / 559.3 / 434.5 ms, where these
list schedules alone reach 438.4 / 554.0 / 432.9: notes AY)."""
FORWARD_YIELD_KEEPS = 4
"""Mixes list-scheduled with `Policy.forward_yield`: bound 4's share for the cut worker and the
next few below it (made-up 4 x 2 x 21 with one stage-1 worker dead: bound 4's share is 20, the
schedule that comes within 1.1% of the bound keeps 18, where every uncut worker carries 22)."""
FORWARD_YIELD_POLICIES = 3
"""Grid policies (rotation 0) tried on each of those mixes: the first three, one per W rule."""
FORWARD_YIELD_MS = 2.0
"""`Policy.forward_yield` of those candidates."""
DYNAMIC_LIST_POLICIES = 6
"""List policies tried with routing decided as the forwards arrive (`Policy.dynamic_routing`)."""
FROZEN_LIST_POLICIES = 6
"""Grid policies (rotation 0: a given routing makes rotations alike) list-scheduled on the routing
the best dynamic schedule followed (`routing_of`)."""
LANE_LIST_POLICIES = 6
"""List policies tried on the re-formed pipelines (`lane_routing`) after its sweeps, the grid's first
with rotation 0 (every sweep and list candidate there costs ~15-30 ms at 8 x 8 x 24)."""
TAIL_LIST_POLICIES = 6
"""Grid policies (rotation 0, most often winning first) re-run with `Policy.tail_forwards`."""
PACED_LIST_POLICIES = 9
"""Grid policies (rotation 0, most often winning first) re-run with `Policy.paced_stage` at each
stage `memory_short_stages` gives: nine reach the first deeper forward-ahead cap, which is where
pacing gained most (made-up 6 x 4 x 21 with [2, 0] dead: 588.0 -> 570.0 ms list-scheduled)."""
SPACED_LIST_POLICIES = 12
"""Grid policies re-run with stage 0's first forwards spaced (`Policy.first_stage_spacing`) where
memory paces stage 0."""
SPACINGS = (0.8, 1.05, 1.2)
"""The spacings tried, in stage-0 cadences (fault-free, made-up jobs whose stage 0 memory paces:
1 x 5 x 10 best at 1.05 (262.4 ms, 0.8 and 1.2 within 0.6%), 4 x 4 x 10 at 0.8-1.2 alike, 349.8 ->
342.4; wider spacings lost everywhere)."""
DEEPER_SLACK = 2
"""How much deeper `deeper_policy`'s forward-ahead cap is (made-up 8 x 5 x 18 spread, 500 swaps
from one routing: fill+0 stays at 504.5 ms, fill+2 and memory-only reach 490.3)."""
STAGE_MIX_LIST_POLICIES = 4
"""Grid policies (rotation 0) list-scheduled on each `stage_mixed_routing`, each also with
`Policy.forwards_first_upstream`."""
UPSTREAM_LIST_POLICIES = 6
"""Grid policies (rotation 0) re-run on the balanced routing with `Policy.forwards_first_upstream`."""
TAIL_FORWARDS = (3, 4, 5, 6)
"""How many last forwards run first (on 8 x 8 x 24 single failures the best was 3 to 6 by stage)."""
SWEEP_POLICIES = [
    SweepPolicy(warmup_slack=slack, w_overrun=overrun) for slack in (0, 1, -1) for overrun in (0.0, 0.5)
]


@dataclass
class SearchInfo:
    """What the search saw besides the winner: whether the winner's replay settled."""

    settled: bool = True
    cycle: int = 1
    unsettled: list[str] = field(default_factory=list)
    """Names of candidates whose replay did not settle (their period is only an estimate)."""


def heuristic_policies(job: JobSpec) -> list[Policy]:
    """The list-scheduling grid, most often winning first (measured on random 1-4 failure sets of
    the shared scenarios), so a time budget cuts the least useful variants."""
    if job.op_count > HEURISTIC_GRID_MAX_OPS:
        return [Policy(feed_bottleneck=True)]
    grid = fill_policies(job)
    for feed in (True, False):
        for slack in (0, 1, None):
            if feed and slack is None:
                continue  # feeding only lifts the forward-ahead cap, which memory-only lacks
            for tolerance in (0.5, None, 0.0):
                for rot in (0, 1):
                    grid.append(Policy(w_tolerance=tolerance, ahead_slack=slack, routing_rotation=rot,
                                       feed_bottleneck=feed))
    return grid


FILL_POLICIES = ((0.5, 1), (None, -1), (0.5, -1), (None, 0), (0.5, 0), (None, 1))
"""(W tolerance, slack) of the fill-the-round-trip policies; the first three won the five failure
sets of the activation_w scenario where a fill policy beat every other candidate."""


def fill_policies(job: JobSpec) -> list[Policy]:
    """Warm-ups that fill each stage's round trip (`Policy.fill_round_trip`), first in the grid, when
    stage 0 may hold more forwards than 1F1B's S. Heuristic only, unlimited budget, on the
    activation_w scenario (memory 16 activations, S = 8): better than every other candidate on 5 of
    its 14 failure sets, the five worst (4 spread failures: 1410.3 -> 1381.6 ms, bound 1319.2);
    on the 1F1B-memory scenarios they never were, so they are not tried there."""
    costs = job.costs
    if costs.activation[0] <= 0 or costs.memory_limit_mb < (job.stages + 1) * costs.activation[0]:
        return []
    return [Policy(w_tolerance=tolerance, ahead_slack=slack, routing_rotation=rot, fill_round_trip=True)
            for tolerance, slack in FILL_POLICIES for rot in (0, 1)]


def best_heuristic(
    job: JobSpec,
    failed: tuple[Worker, ...],
    bound_ms: float = 0.0,
    budget_s: float = float("inf"),
    template: list[Op] | None = None,
    info: SearchInfo | None = None,
) -> tuple[list[Op], float, str]:
    """The best constructive schedule by replayed period: Zero-Bubble-style 1F1B sweeps, list
    schedules over the policy grid, and the best list schedule with its W's re-placed by a sweep.
    Stops early once a schedule reaches the proven bound `bound_ms` (nothing can beat it), and
    skips the remaining list policies once `budget_s` is spent (at least four always run; pass
    `budget_s=inf` for a deterministic search). `info`, when given, receives whether the winner's
    replay settled."""
    started = time.perf_counter()
    best: tuple[list[Op], float, str] | None = None
    seen = SearchInfo() if info is None else info
    replays: dict[bytes, ReplayReport | None] = {}

    def replay_once(ops: list[Op]) -> ReplayReport | None:
        """`_replay`, once per distinct schedule (the replay is a function of the ops alone): on one
        pipeline the grid's routing rotations route alike, so 79 of the 131 candidates of a 1 x 16 x
        128 fault-free plan were schedules already replayed. Keyed by a 128-bit digest of every
        op's fields, not the ops themselves (holding every candidate would cost gigabytes at 60,000
        ops)."""
        ids, times = array("q"), array("d")
        for op in ops:
            ids.extend((*op.worker, *(op.microbatch or (-1, -1))))
            times.extend((op.start_ms, op.end_ms))
        digest = hashlib.blake2b(ids.tobytes(), digest_size=16)
        digest.update(times.tobytes())
        digest.update("".join(op.kind for op in ops).encode())
        key = digest.digest()
        if key not in replays:
            replays[key] = _replay(job, ops)
        return replays[key]

    def consider(ops: list[Op] | None, name: str, report: ReplayReport | None | bool = True) -> bool:
        """Keep the schedule if it is the best so far; True once the bound is reached. `report`:
        its replay when already made (None: the replay raised), True: replay it here."""
        nonlocal best
        if ops is not None:
            if report is True:
                report = replay_once(ops)
            if report is not None and not report.converged:
                seen.unsettled.append(name)
            if report is not None and (best is None or report.iteration_ms < best[1] - 1e-9):
                best = (ops, report.iteration_ms, name)
                seen.settled, seen.cycle = report.converged, report.cycle
        return best is not None and seen.settled and best[1] <= bound_ms + 1e-6

    big = job.op_count > HEURISTIC_GRID_MAX_OPS
    routings: dict[int, Routing] = {}
    listed: list[tuple[float, Policy, Routing, str]] = []  # fixed-routing list schedules, by name

    def consider_list(ops: list[Op], policy: Policy, routing: Routing, name: str | None = None) -> bool:
        """`consider` for a list schedule, remembered (with its routing) for the routing search."""
        report = replay_once(ops)
        name = name or policy.name
        if report is not None and report.converged:
            listed.append((report.iteration_ms, policy, routing, name))
        return consider(ops, name, report)

    def routing(rot: int) -> Routing:
        return routings.setdefault(rot, balanced_routing(job, failed, rot))

    @functools.cache
    def failure_bound() -> float:
        """`lower_bound(job, failed)`, made once and only when a routing is checked (`bound_ms` is it
        when the caller passed it)."""
        return bound_ms if bound_ms > 0 else lower_bound(job, failed).value_ms

    inserted: dict[str, tuple[list[Op], SweepPolicy, bool]] = {}  # name: template, sweep, pairs
    if template is not None and failed:
        # Minimal disruption first: the fault-free plan everywhere, re-routed work inserted on peers;
        # below the grid's size also into Zero Bubble's greedy schedules (`zb_greedy_templates`).
        # Where the last stage lost a worker, each insertion is also made with the moved
        # micro-batches' F and B there as one pair after the peer's own B (`insertion_orders`);
        # below the grid's size only (at 1024 x 16 x 64 with a last-stage failure among eight the
        # extra sweep cost 1.26 -> 1.64 s of the CLI's wall and did not win).
        templates = [(template, "fault-free")]
        if not big:
            templates += zb_greedy_templates(job, ZB_TEMPLATES)
        rotations = (0, 1) if not big else (0,)
        placements = (False, True) if not big and any(s == job.stages - 1 for _, s in failed) else (False,)
        for (into, label), rot, pairs in itertools.product(templates, rotations, placements):
            orders = insertion_orders(job, routing(rot), into, last_stage_pairs=pairs)
            for overrun in (0.0, 0.5) if not big else (0.0,):
                policy = SweepPolicy(w_overrun=overrun, routing_rotation=rot)
                name = (f"insert-into-{label}(overrun={overrun:g},rot={rot}"
                        f"{',last-stage-pairs' if pairs else ''})")
                inserted[name] = (into, policy, pairs)
                if consider(sweep_schedule(job, routing(rot), policy, orders), name):
                    return best
    # The ReCycle paper's construction: the planner is never behind it. Above the grid's size it
    # is skipped like the grid (it cost 1.9 of 7 s at 32 x 16 x 64 and never won there).
    if failed and not big and consider(paper_style_schedule(job, failed), "paper-style(1F1B,round-robin)"):
        return best
    if not big:
        for policy in SWEEP_POLICIES:
            if consider(sweep_schedule(job, routing(0), policy), policy.name):
                return best
    if not failed:  # Zero Bubble's own greedy (never behind it), then warm-ups deeper than 1F1B's
        for ops, name in (*zb_greedy_candidates(job), *deep_warmup_candidates(job, routing(0))):
            if consider(ops, name):
                return best
    dissolved = dissolving_routing(job, failed) if failed else None
    first_list = None
    if dissolved is not None and big:
        # The list schedule (always run) made before the dissolve sweep, only so that its period
        # can rule that sweep out (`_beaten`); it is considered in its own place below.
        policy = heuristic_policies(job)[0]
        ops = list_schedule(job, routing(policy.routing_rotation), policy)
        first_list = (ops, replay_once(ops))
    if dissolved is not None:
        # Dissolving the damaged pipelines into the others is always a candidate, so a plan is
        # never slower than dropping them (with the same scheduler).
        beaten = _beaten(job, dissolved, best, failure_bound, first_list)
        for policy in SWEEP_POLICIES[:1] if big else SWEEP_POLICIES:
            if not beaten and consider(sweep_schedule(job, dissolved, policy), f"dissolve+{policy.name}"):
                return best
        dropped = dropped_job(job, failed) if not big else None
        # The dropped plan's period is at least the dropped job's own bound, so when the best so far
        # is already there it cannot win; skipping it spares the dropped job's fault-free plan (with
        # the opt-in CP-SAT step, 8-12 s of wall at load 5 on a 4 x 5 x 15 dropped job, which inside
        # a 10 s solve left CP-SAT no time at all).
        if dropped is not None and best is not None and best[1] <= lower_bound(dropped, ()).value_ms + 1e-6:
            dropped = None
        if dropped is not None:
            from planner.fault_free import fault_free_plan, replicate

            # Within a budget the dropped job's CP-SAT step (when asked for) gets what is left of it
            # (at least 1 s): its deterministic time alone ran for minutes of wall on a loaded box.
            left = budget_s - (time.perf_counter() - started)
            cap = None if budget_s == float("inf") else max(1.0, left)
            dropped_ops = replicate(dropped, fault_free_plan(dropped, wall_cap_s=cap).ops)
            if consider(relabel_dropped(job, failed, dropped, dropped_ops), "drop-damaged-pipelines"):
                return best
    first_policies = [p for p in heuristic_policies(job) if p.routing_rotation == 0]
    lanes = lane_routing(job, failed) if failed else None
    if lanes is not None and (dissolved is None or lanes.moved != dissolved.moved) \
            and not _beaten(job, lanes, best, failure_bound):
        # Re-formed pipelines: the survivors wired into as many chains as the emptiest stage has
        # workers (where failures are spread, dropping leaves few pipelines or none). The routing
        # is the same for every rotation, so only the rotation-0 list policies are tried; above
        # the grid's size only the first sweep, like the dissolve.
        for policy in SWEEP_POLICIES[:1] if big else SWEEP_POLICIES:
            if consider(sweep_schedule(job, lanes, policy), f"lanes+{policy.name}"):
                return best
        for policy in [] if big else first_policies[:LANE_LIST_POLICIES]:
            if consider_list(list_schedule(job, lanes, policy), policy, lanes, f"lanes+{policy.name}"):
                return best
    # With every failure at one stage the re-routing (`balanced_routing`) already keeps every
    # survivor busy, moving only the failed workers' micro-batches, where the spill moves a share
    # at every other stage too: tried only with failures at several stages.
    spread = len({s for _, s in failed}) > 1
    spilled = lane_routing(job, failed, spill=True) if spread and not big else None
    if spilled is not None and (lanes is None or spilled.moved != lanes.moved) \
            and not _beaten(job, spilled, best, failure_bound):
        # The chains with the workers they leave out taking an even share (`lane_routing`'s spill):
        # where the widest stage is the bottleneck, the chains alone leave part of it idle. Whole
        # candidates, not starting points of the routing search: from their routing it ended
        # worse where they won by little (made-up 3 x 6 x 6 pipeline, 160.2 -> 161.5-163.6 ms).
        for policy in first_policies[:LANE_LIST_POLICIES]:
            if consider(list_schedule(job, spilled, policy), f"spilled-lanes+{policy.name}"):
                return best
    best_list: tuple[float, Policy, list[Op]] | None = None  # the best list schedule so far

    def keep_list(policy: Policy, ops: list[Op]) -> None:
        """Remember the best list schedule by its own period, winner or not, for the resweep."""
        nonlocal best_list
        report = replay_once(ops)
        if report is not None and report.converged and (
                best_list is None or report.iteration_ms < best_list[0] - 1e-9):
            best_list = (report.iteration_ms, policy, ops)

    for tried, policy in enumerate(heuristic_policies(job)):
        if tried >= 4 and time.perf_counter() - started > budget_s:
            break
        if policy.routing_rotation and routing(policy.routing_rotation).moved == routing(0).moved:
            # The same routing as rotation 0 (always so fault-free: nothing is re-routed), so the
            # same schedule as the rotation-0 policy tried just before, which wins any tie.
            continue
        if tried == 0 and first_list is not None:
            ops, report = first_list
            done = consider(ops, policy.name, report)
        else:
            ops = list_schedule(job, routing(policy.routing_rotation), policy)
            done = consider_list(ops, policy, routing(policy.routing_rotation))
        keep_list(policy, ops)
        if done:
            return best
    variants: list[Policy] = []
    if failed and not big:
        # The grid's first rotation-0 policies again, with the busiest stage running its last
        # forwards before its input gradients (`Policy.tail_forwards`): 8 x 8 x 24 with [0, 3] dead,
        # 1491.5 -> 1456.8 ms against the bound's 1413.7 (docs/notes/planner-issue8.md, H).
        variants += [replace(p, tail_forwards=k, tail_upstream=up) for up in (False, True)
                     for p in first_policies[:TAIL_LIST_POLICIES] for k in TAIL_FORWARDS]
    if failed and not big and bottleneck_stage(job, routing(0)) > 0:
        # Forwards first above the bottleneck stage (`Policy.forwards_first_upstream`).
        variants += [replace(p, forwards_first_upstream=True)
                     for p in first_policies[:UPSTREAM_LIST_POLICIES]]
    stage0_paced = not big and memory_paces_first_stage(job, failed)
    for stage in memory_short_stages(job, routing(0)) if not big else ():
        # Stage 0 where its busiest worker cannot hold what it carries: its forwards are paced by
        # the W's that free memory (made-up 7 x 4 x 18, three stage-0 failures: 446.1 -> 434.1 ms).
        # The same at a deeper bottleneck stage (a stage left to few survivors): each freed slot
        # starts its next round trip before the gradients queued for the stage above are sent on
        # (made-up 4 x 5 x 24, stage 1 left to one worker: 1219.6 -> 1143.8 ms, bound 1125.9).
        # Always on jobs up to MIXES_ALWAYS_MAX_OPS; above, within the budget (but stage 0 where
        # `memory_paces_first_stage`, the first condition, always). Fault-free too (one pipeline,
        # so also the dropped-pipelines candidate): made-up 1 x 7 x 15 whose stage 0 holds 4,
        # 381.02 -> 367.72 ms with swaps (bound 344.32); over 240 fault-free and dropped plans of
        # six made-up seeds 9 faster, none slower (notes AO).
        variants += [replace(p, paced_stage=stage) for p in first_policies[:PACED_LIST_POLICIES]]
    if stage0_paced:
        # Stage 0's slots started a cadence apart instead of as one burst (`Policy.first_stage_spacing`).
        variants += [replace(p, first_stage_spacing=x) for x in SPACINGS
                     for p in first_policies[:SPACED_LIST_POLICIES]]
    for tried, policy in enumerate(variants):
        # Pacing beyond stage 0's first condition (`memory_paces_first_stage`), on jobs above
        # MIXES_ALWAYS_MAX_OPS: within the budget, and whole candidates (below).
        paced_more = policy.paced_stage is not None and not (policy.paced_stage == 0 and stage0_paced) \
            and job.op_count > MIXES_ALWAYS_MAX_OPS
        optional = policy.tail_forwards or policy.forwards_first_upstream or (
            failed and policy.first_stage_spacing) or paced_more
        if optional and tried >= 4 and time.perf_counter() - started > budget_s:
            continue
        ops = list_schedule(job, routing(0), policy)
        # Forwards first: whole candidates, not starts of the routing search, which from them
        # ended worse on gpt-1.5b 8 x 8 x 24 with (0, 1), (1, 1) dead (1686.3 -> 1692.9 ms). The
        # paced ones likewise above MIXES_ALWAYS_MAX_OPS (the same case: 1686.3 -> 1690.6).
        if policy.forwards_first_upstream or paced_more:
            done = consider(ops, policy.name)
        else:
            done = consider_list(ops, policy, routing(0))
        keep_list(policy, ops)
        if done:
            return best
    if not big and best_list is not None:
        _, policy, ops = best_list
        orders = orders_of(ops)
        for overrun in (0.0, 0.5, 1.0):
            sweep = SweepPolicy(w_overrun=overrun, routing_rotation=policy.routing_rotation)
            name = f"{policy.name}+resweep(overrun={overrun:g})"
            if consider(sweep_schedule(job, routing(policy.routing_rotation), sweep, orders), name):
                return best
    if dissolved is not None and not big:
        # Dropping with the damaged pipelines' survivors kept at the heaviest stages
        # (`stage_mixed_routing`), plain and with forwards first above the bottleneck. Whole
        # candidates, like the spilled chains; always on small jobs, within the budget above that.
        # A kept set is tried only where its survivors lower the routing's bound below the
        # smaller set's (one more stage kept that relieves nothing only adds crossings).
        previous = routing_bound(job, dissolved.busiest, failure_bound())
        for kept in kept_stage_sets(job, failed):
            if job.op_count > MIXES_ALWAYS_MAX_OPS and time.perf_counter() - started > budget_s:
                break
            mixed = stage_mixed_routing(job, failed, kept)
            relieved = routing_bound(job, mixed.busiest, failure_bound())
            if relieved >= previous - BEATEN_MARGIN_MS or _beaten(job, mixed, best, failure_bound):
                previous = min(previous, relieved)
                continue
            previous = relieved
            label = "stage-mix(" + ",".join(map(str, sorted(kept))) + ")+"
            upstream = bottleneck_stage(job, mixed) > 0  # else forwards first changes nothing
            for policy in first_policies[:STAGE_MIX_LIST_POLICIES]:
                for first in (False, True) if upstream else (False,):
                    variant = replace(policy, forwards_first_upstream=first)
                    if consider(list_schedule(job, mixed, variant), label + variant.name):
                        return best
    if dissolved is not None:
        # Mixes: part of each damaged pipeline dissolved, the rest kept on its alive workers (tried
        # last and within the budget: the guarantee against dropping rests on the candidates above).
        M = job.microbatches
        # First the share bound 4 gives a worker cut from its next stage (what a plan reaching that
        # bound would keep on it; list-scheduled too, since with little memory the sweeps' warm-up
        # shape is what costs: 8 x 2 x 23, docs/notes/bounds.md section 4), then fixed fractions.
        shared = [keep for keep in cut_worker_shares(job, failed) if 0 < keep < M] if not big else []
        for keep in shared:
            mixed = mixed_routing(job, failed, keep)
            if _beaten(job, mixed, best, failure_bound):
                continue
            for policy in heuristic_policies(job)[:MIX_LIST_POLICIES]:
                ops = list_schedule(job, mixed, policy)
                if consider_list(ops, policy, mixed, f"mix(keep={keep})+{policy.name}"):
                    return best
        # Nearly whole: each damaged pipeline dissolves only a few micro-batches. Its survivors
        # pay a cross-pipeline hop both ways on every round trip through its failed stage, which
        # lengthens every round of a memory-paced loop above it; a few micro-batches moved whole
        # to the healthy pipelines take rounds off that loop and add little to theirs (one more on
        # n where n is not a multiple of the slots costs no extra round). Candidates for the
        # routing search too (`consider_list`).
        near = [keep for keep in range(M - 1, M - 1 - NEAR_WHOLE_KEEPS, -1)
                if keep > 0 and keep not in shared]
        for keep in near if not big else ():
            if job.op_count > MIXES_ALWAYS_MAX_OPS and time.perf_counter() - started > budget_s:
                break
            mixed = mixed_routing(job, failed, keep)
            if _beaten(job, mixed, best, failure_bound):
                continue
            policies = first_policies[:MIX_LIST_POLICIES] + [
                replace(p, paced_stage=stage) for stage in memory_short_stages(job, mixed)
                for p in first_policies[:PACED_LIST_POLICIES]]
            for policy in policies:
                ops = list_schedule(job, mixed, policy)
                if consider_list(ops, policy, mixed, f"mix(keep={keep})+{policy.name}"):
                    return best
        for keep in [*shared, *sorted({M // 4, M // 2, (3 * M) // 4} - {0, M, *shared})]:
            mixed = mixed_routing(job, failed, keep)
            if _beaten(job, mixed, best, failure_bound):
                continue
            for policy in SWEEP_POLICIES[:1] if big else SWEEP_POLICIES:
                if job.op_count > MIXES_ALWAYS_MAX_OPS and time.perf_counter() - started > budget_s:
                    break
                if consider(sweep_schedule(job, mixed, policy), f"mix(keep={keep})+{policy.name}"):
                    return best
        # The same mixes, and a few that keep fewer, with the peers' own forwards first
        # (`Policy.forward_yield`): where memory holds one micro-batch per stage-0 worker, a peer
        # that serves a cut worker's round trip when its own is due stalls its own pipeline.
        # Only on jobs up to MIXES_ALWAYS_MAX_OPS: above it the twelve list schedules would come out
        # of the routing search's wall budget, for a gain measured on a small job only.
        keeps = sorted({keep - less for keep in shared for less in range(FORWARD_YIELD_KEEPS)} - {0},
                       reverse=True) if job.op_count <= MIXES_ALWAYS_MAX_OPS else []
        for keep in keeps:
            mixed = mixed_routing(job, failed, keep)
            if _beaten(job, mixed, best, failure_bound):
                continue
            for policy in first_policies[:FORWARD_YIELD_POLICIES]:
                policy = replace(policy, forward_yield=FORWARD_YIELD_MS)
                if consider(list_schedule(job, mixed, policy), f"mix(keep={keep})+{policy.name}"):
                    return best
    in_budget = job.op_count <= MIXES_ALWAYS_MAX_OPS or time.perf_counter() - started <= budget_s
    if failed and not big and in_budget:
        # Routing decided as the forwards arrive (`Policy.dynamic_routing`), on the balanced routing
        # and on bound 4's share-keeping mixes: where few micro-batches fit in memory the next
        # stage's workers are shared by the round trips, and a fixed routing waits for a busy peer
        # while another is free (4 x 2 x 19, one failure at stage 1: 714.5 -> 706.2 ms).
        keeps = [keep for keep in cut_worker_shares(job, failed) if 0 < keep < job.microbatches]
        dynamic = [("", routing(0))]
        dynamic += [(f"mix(keep={keep})+", mixed_routing(job, failed, keep)) for keep in keeps]
        best_dynamic: tuple[float, list[Op], str] | None = None
        for label, base in dynamic:
            if base is None:
                continue
            for policy in heuristic_policies(job)[:DYNAMIC_LIST_POLICIES]:
                policy = replace(policy, dynamic_routing=True)
                ops, name = list_schedule(job, base, policy), f"{label}{policy.name}"
                report = replay_once(ops)
                if report is not None and report.converged and (
                        best_dynamic is None or report.iteration_ms < best_dynamic[0] - 1e-9):
                    best_dynamic = (report.iteration_ms, ops, name)
                if consider(ops, name, report):
                    return best
        if best_dynamic is not None:
            # The best dynamic schedule's routing, frozen, under the grid's fixed-routing policies:
            # the arrival-time choices find a routing, but the dynamic scheduler's own orders are
            # not the best ones for it (made-up 4 x 5 x 24 with (0, 2), (0, 3) dead: 1000.13
            # dynamic, 970.99 frozen, notes AE). Whole candidates only, not a start for the routing
            # search below: from them it found less than from the fixed routings' best (made-up
            # 4 x 4 x 10 stage: 618.5 against 614.0).
            frozen = routing_of(job, failed, best_dynamic[1])
            for policy in first_policies[:FROZEN_LIST_POLICIES]:
                if consider(list_schedule(job, frozen, policy), f"frozen({best_dynamic[2]})+{policy.name}"):
                    return best
    if failed and not big and trips_apply(job, failed):
        # A stage left to one worker: round trips booked whole, into the gaps, the slots phased by
        # a cadence (`planner.trips`; made-up 2 x 2 x 22 with (1, 0) dead: 485.3 -> 466.9 ms in a
        # 10 s plan, bound 462.0). Small jobs only, and a share of the budget.
        deadline = time.perf_counter() + TRIPS_BUDGET_SHARE * budget_s
        for ops, name in trip_candidates(job, failed, failure_bound(), deadline):
            if consider(ops, name):
                return best
    if failed and not big and best is not None and best[2] in inserted:
        # An insertion is the best candidate: which peer serves which moved micro-batch, judged by
        # the same insertion (the list policies below judge a routing by list schedules, which do
        # not reproduce it), with INSERTION_SEARCH_SHARE of what is left of the budget (made-up
        # 5 x 8 x 12 with (3, 4) dead: 335.3 -> 331.2 ms; notes AU).
        into, sweep, pairs = inserted[best[2]]
        left = max(0.0, started + budget_s - time.perf_counter())

        def judge(candidate: Routing) -> list[Op] | None:
            orders = insertion_orders(job, candidate, into, last_stage_pairs=pairs)
            return sweep_schedule(job, candidate, sweep, orders)

        found = search_routing(job, routing(sweep.routing_rotation), [], best[1], bound_ms,
                               deadline=time.perf_counter() + INSERTION_SEARCH_SHARE * left,
                               any_share=0.0, span_margin=None, judge=judge)
        if found is not None:
            name = f"{best[2]}+routes({found.accepted}/{found.evaluations})"
            if consider(found.ops, name):
                return best
    if failed and not big and listed:
        # Which peer serves which micro-batch, searched by swaps on the best list schedule's
        # routing with what is left of the budget (`planner.route_search`: 8 x 8 x 24 with [0, 4]
        # dead, 1454.6 -> 1442.7-1444.1 ms against the bound's 1405.3).
        # The best policy, and on jobs up to MIXES_ALWAYS_MAX_OPS the same with a forward-ahead
        # cap two deeper (`deeper_policy`): a deeper warm-up is what a swapped routing can feed
        # (notes K: made-up 8 x 5 x 18 spread, 10 s plan 504.5 -> 497.2 ms). Not on larger jobs,
        # where the wall budget ends the search and a second policy halves its swaps: three grid
        # policies per swap found no better routing in 100 swaps on 8 x 8 x 24 [0, 4] (notes J),
        # and the deeper one there cost [0, 3] 1439.6 -> 1442.8-1448.7 ms (notes K).
        top_ms, top_policy, top_routing, top_name = min(listed, key=lambda entry: entry[0])
        policies = [top_policy]
        if job.op_count <= MIXES_ALWAYS_MAX_OPS and deeper_policy(top_policy) != top_policy:
            policies.append(deeper_policy(top_policy))
        found = search_routing(job, top_routing, policies, top_ms, bound_ms, deadline=started + budget_s,
                               still_stages=job.op_count <= MIXES_ALWAYS_MAX_OPS)
        if found is not None:
            # Named after the list schedule it started from (its routing's label: mix, lanes),
            # with the policy that won.
            label = top_name.replace(top_policy.name, found.policy.name)
            name = f"{label}+routes({found.accepted}/{found.evaluations})"
            if consider(found.ops, name):
                return best
    assert best is not None
    tail = first_stage_tail(job, best[0])
    if tail is not None:
        consider(tail, f"{best[2]}+first-stage-tail")
    return best


def memory_paces_first_stage(job: JobSpec, failed: tuple[Worker, ...]) -> bool:
    """Whether the busiest stage-0 worker holds fewer micro-batches than it carries, and fewer than
    would keep it busy for a round trip (its F start -> W end, uncongested, same-pipeline hops)."""
    costs, S = job.costs, job.stages
    dead = set(map(tuple, failed))
    alive = sum(1 for p in range(job.pipelines) if (p, 0) not in dead)
    carried = -(-job.pipelines * job.microbatches // max(alive, 1))
    held = costs.fits(0, carried)
    f, b, w = costs.forward, costs.backward_input, costs.backward_weight
    round_trip = sum(f) + sum(b) + w[0] + 2 * sum(costs.p2p[:S - 1])
    return held < carried and held * (f[0] + b[0] + w[0]) < round_trip


def memory_short_stages(job: JobSpec, routing: Routing) -> list[int]:
    """Stage 0 and the bottleneck stage (`bottleneck_stage`), each where its busiest worker under
    `routing` cannot hold all the micro-batches it carries: where `Policy.paced_stage` may help.
    Stage 0 used to be tried only where `memory_paces_first_stage` (its slots also too few to keep
    it busy for a round trip); without that condition it won 3 more of 396 small made-up cases
    (up to 17.1 ms) and lost 1 by 1.8 ms (notes AL)."""
    busiest = routing.busiest  # a property that walks every worker
    return [stage for stage in sorted({0, bottleneck_stage(job, routing)})
            if job.costs.fits(stage, busiest[stage]) < busiest[stage]]


def deeper_policy(policy: Policy) -> Policy:
    """`policy` with its forward-ahead cap two deeper (unchanged when only memory caps it): where
    a bottleneck worker's first input gradient comes late, more forwards in its warm-up fill the
    wait, but only once the routing feeds them, which is what the routing search changes."""
    if policy.ahead_slack is None:
        return policy
    return replace(policy, ahead_slack=policy.ahead_slack + DEEPER_SLACK)


def _replay(job: JobSpec, ops: list[Op]) -> ReplayReport | None:
    try:
        return replay(job, ops)
    except ReplayError:
        return None


def _beaten(job: JobSpec, routing: Routing | None, best: tuple[list[Op], float, str] | None,
            failure_bound: Callable[[], float],
            first_list: tuple[list[Op], ReplayReport | None] | None = None) -> bool:
    """Whether no schedule with `routing` can win: its proven bound (`lower_bound` with the
    routing's own busiest loads, `routing_bound`; `failure_bound` gives the failure set's) is
    above the best period so far, or above the period of the list
    schedule `first_list` that the search considers after it (which would then replace it:
    `consider` keeps the first of equal periods, so only a strictly higher bound rules out).
    Skipping such a candidate changes no result, as long as its replay would have settled (the
    estimate of an unsettled replay is not bounded; docs/design.md)."""
    if routing is None:
        return False
    periods = [best[1]] if best is not None else []
    if first_list is not None and first_list[1] is not None:
        periods.append(first_list[1].iteration_ms)
    if not periods:
        return False
    return routing_bound(job, routing.busiest, failure_bound()) > min(periods) + BEATEN_MARGIN_MS


BEATEN_MARGIN_MS = 1e-6
"""A bound must exceed a period by this much to rule a candidate out (rounding in either)."""


