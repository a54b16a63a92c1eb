"""List schedules that route each micro-batch at the next stage when its forward arrives
(`Policy.dynamic_routing`, tried by `planner.candidates.best_heuristic`; issue 8, made-up jobs).

Where memory lets one micro-batch through at a time, the next stage's workers are a resource the
round trips share: a routing fixed in advance makes a forward wait for a busy peer while another is
free. The dynamic list schedule picks, when the forward at stage s - 1 ends, the alive stage-s peer
expected to start it first.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

import planner.candidates as candidates
from planner.candidates import best_heuristic, heuristic_policies
from planner.heuristic import Policy, list_schedule
from planner.routing import balanced_routing
from planner.simulator import replay
from planner.spec import JobSpec
from planner.validate import validate
from tests.planner.random_plans import max_cycle_mean

# 3 x 2 x 2, stage 1 of pipeline 0 dead; one micro-batch between F start and B end per worker
# (activation 2 of 3 MB), one W pending beside it (activation_w 1); cross-pipeline hops cost 1 ms.
SHARED_NEXT_STAGE = {
    "pipelines": 3, "stages": 2, "microbatches": 2, "forward_ms": [1, 2], "backward_input_ms": [1, 2],
    "backward_weight_ms": [1, 1], "p2p_ms": 0, "cross_pipeline_p2p_ms": 1, "allreduce_ms": 1,
    "optimizer_ms": 0, "activation_mb": 2, "activation_w_mb": 1, "memory_limit_mb": 3,
}


def test_dynamic_routing_beats_every_fixed_routing_candidate(monkeypatch):
    """The six micro-batches need the two stage-1 workers (4 ms each, one at a time). The plan the
    dynamic list schedule makes (checked op by op when this test was written): worker (2, 1) serves
    (2, 0) at 1-5, (1, 0) at 5-9 and (0, 1) at 10-14, worker (1, 1) serves (0, 0) at 2-6, (2, 1) at
    8-12 and (1, 1) at 12-16, the last stage-0 W ends at 18 (worker (1, 0): its B of (1, 1) at 16
    after the stage-1 B ends at 16 with a same-pipeline hop of 0, W 17-18), all-reduce 18-19:
    19 ms. Every fixed-routing candidate of the search stays at 20 ms (measured), so the 19 comes
    from the dynamic candidate. The period is also checked by the max-cycle-mean method."""
    job = JobSpec.parse(SHARED_NEXT_STAGE)
    failed = ((0, 1),)
    ops, period, name = best_heuristic(job, failed)
    assert not validate(job, failed, ops)
    assert period == 19.0
    assert max_cycle_mean(job, ops) == 19.0
    assert "dynamic" in name
    monkeypatch.setattr(candidates, "DYNAMIC_LIST_POLICIES", 0)
    _, fixed, fixed_name = best_heuristic(job, failed)
    assert fixed == 20.0, fixed_name


def test_dynamic_routing_on_the_4x2x19_made_up_job():
    """benchmarks/gap_unseen.py --seed 1, job #2 with pipeline 1's stage 1 dead (canonical: pipeline
    0): one micro-batch at a time on both stages. Fixed routings (every `keep` of the mixes) reach
    713.8 ms at best; the dynamic list schedule on the balanced routing 706.16 ms (measured)."""
    job = JobSpec.parse({
        "pipelines": 4, "stages": 2, "microbatches": 19, "forward_ms": [6.3, 8.3],
        "backward_input_ms": [6.9, 8.8], "backward_weight_ms": [4.3, 3.5], "p2p_ms": 0.18,
        "cross_pipeline_p2p_ms": 2.1, "allreduce_ms": 34.8, "optimizer_ms": 4.7,
        "activation_mb": [2.0, 2.8], "activation_w_mb": [1.5, 0.7], "memory_limit_mb": 3.5})
    failed = ((0, 1),)
    policy = next(p for p in heuristic_policies(job) if p.name == "W=yield0,feed,cap=S-s+0,rot=0")
    routing = balanced_routing(job, failed, 0)
    fixed = replay(job, list_schedule(job, routing, policy)).iteration_ms
    ops = list_schedule(job, routing, _dynamic(policy))
    assert not validate(job, failed, ops)
    assert replay(job, ops).iteration_ms == pytest.approx(706.16, abs=1e-6)
    assert replay(job, ops).iteration_ms < fixed - 1.0


def _dynamic(policy: Policy) -> Policy:
    return replace(policy, dynamic_routing=True)


@pytest.mark.parametrize("seed", range(40))
def test_dynamic_list_schedules_are_valid_and_replay_their_own_period(seed):
    """Random small jobs and failure sets (rule 1: F, B and W of a micro-batch on one worker of a
    stage, although the stage is chosen only when the forward arrives): the validator accepts the
    plan and the replayed period equals the max cycle mean."""
    rng = random.Random(seed)
    D, S, M = rng.randint(2, 4), rng.randint(1, 4), rng.randint(1, 4)
    ints = lambda: [float(rng.randint(1, 4)) for _ in range(S)]  # noqa: E731
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": ints(),
            "backward_input_ms": ints(), "backward_weight_ms": ints(),
            "p2p_ms": float(rng.randint(0, 1)), "cross_pipeline_p2p_ms": float(rng.randint(1, 3)),
            "allreduce_ms": float(rng.randint(0, 3)), "optimizer_ms": float(rng.randint(0, 2)),
            "activation_mb": 2.0, "activation_w_mb": float(rng.choice([0, 1, 2])),
            "memory_limit_mb": 2.0 * rng.randint(1, S + 1) + rng.choice([0.0, 1.0])}
    job = JobSpec.parse(spec)
    failed = tuple(sorted({(rng.randrange(D - 1), rng.randrange(S)) for _ in range(rng.randint(1, 3))}))
    routing = balanced_routing(job, failed, 0)
    for policy in heuristic_policies(job)[:6]:
        ops = list_schedule(job, routing, _dynamic(policy))
        assert not validate(job, failed, ops), policy.name
        report = replay(job, ops)
        if report.converged:
            assert report.iteration_ms == pytest.approx(max_cycle_mean(job, ops), abs=1e-9)
