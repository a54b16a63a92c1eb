"""The ReCycle paper's constructive schedule (Gandhi et al., SOSP 2024), as one planner candidate.

The paper keeps the fault-free 1F1B order on every healthy worker (backward split into B and W, W
deferred into bubbles: "decoupled back-propagation") and re-routes each failed worker's
micro-batches round-robin to its alive same-stage peers ("adaptive pipelining"); its planner then
hands that schedule to a solver. This module builds the constructive part:
1. the 1F1B template of one pipeline: warm-up of S - s forwards at stage s, then one B and one F
   in turn, W's placed in the gaps before the next input (`sweep_schedule`'s default policy);
2. round-robin routing: at each stage the failed workers' micro-batches, in index order (and home
   order within an index), go to the alive peers in turn, one cursor per stage;
3. every alive worker keeps the template's F/B order, each re-routed micro-batch inserted right
   after the peer's own op of the same index (`insertion_orders`), and W's re-placed by the sweep;
   or, where that is better or the inserted warm-up does not fit memory, plain 1F1B over each
   worker's own and received micro-batches.

It is one more candidate of the planner's portfolio (`planner.candidates`), so the planner's plan is
never slower than this construction; `evaluation.paper_planner` adds the paper's solver step (CP-SAT
with the routing fixed) to build the comparison baseline of issue 8.
"""

from __future__ import annotations

from planner.fault_free import single_pipeline
from planner.routing import Routing
from planner.simulator import ReplayError, replay
from planner.spec import JobSpec, Worker
from planner.sweep import SweepPolicy, insertion_orders, sweep_schedule
from planner.timeline import Op

ONE_F_ONE_B = SweepPolicy(warmup_slack=0, w_overrun=0.0)
"""1F1B's warm-up depth (S - s forwards), W's only where they fit before the next input."""


def round_robin_routing(job: JobSpec, failed: tuple[Worker, ...]) -> Routing:
    """Each failed worker's micro-batches dealt to its alive same-stage peers in turn."""
    dead = set(failed)
    moved: dict[tuple[int, int, int], int] = {}
    for s in range(job.stages):
        peers = [p for p in range(job.pipelines) if (p, s) not in dead]
        homes = [p for p in range(job.pipelines) if (p, s) in dead]
        cursor = 0
        for m in range(job.microbatches):
            for home in homes:
                moved[(home, m, s)] = peers[cursor % len(peers)]
                cursor += 1
    return Routing(job, tuple(sorted(failed)), moved)


def one_f_one_b_template(job: JobSpec) -> list[Op] | None:
    """One pipeline's fault-free 1F1B schedule (pipeline 0's ops), None if it does not fit memory."""
    single = single_pipeline(job)
    return sweep_schedule(single, round_robin_routing(single, ()), ONE_F_ONE_B)


def paper_style_schedule(job: JobSpec, failed: tuple[Worker, ...]) -> list[Op] | None:
    """The paper's constructive schedule for `job` with `failed` dead: the better (replayed period)
    of two ways to run the round-robin routing with 1F1B, None only when neither exists.
    - template kept: every worker keeps the fault-free 1F1B order, re-routed micro-batches inserted
      (the peers' warm-up then holds more micro-batches: it can exceed the memory limit);
    - 1F1B over each worker's own and received micro-batches (by index), warm-up S - s: the same
      order on every worker that received nothing, and within memory whenever 1F1B is (when its
      fixed orders deadlock, the same with the shallowest warm-up reduction that does not)."""
    best: tuple[float, list[Op]] | None = None
    routing = round_robin_routing(job, failed)
    template = one_f_one_b_template(job)
    kept = None if template is None else insertion_orders(job, routing, template)
    for orders in (kept, None) if kept is not None else (None,):
        ops = sweep_schedule(job, routing, ONE_F_ONE_B, orders)
        if ops is None and orders is None:
            # Stage-concentrated failures: a peer carrying several pipelines' micro-batches cannot
            # hold S - s warm-up forwards of each within memory, and the next stage's warm-up then
            # waits on forwards the peer never sends. A shallower warm-up on every stage (down to
            # one forward: plain alternation, always feasible) is the 1F1B order that exists.
            for slack in range(-1, -job.stages - 1, -1):
                ops = sweep_schedule(job, routing, SweepPolicy(warmup_slack=slack))
                if ops is not None:
                    break
        if ops is None:
            continue
        try:
            period = replay(job, ops).iteration_ms
        except ReplayError:
            continue
        if best is None or period < best[0] - 1e-9:
            best = (period, ops)
    return None if best is None else best[1]
