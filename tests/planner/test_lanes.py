"""Re-formed pipelines (`planner.routing.lane_routing`, tried by `best_heuristic`; issue 8, the 1.03
bar): the survivors wired into min_s alive_s chains, every micro-batch on one chain at every stage.

The hand-worked case is the shared 4 x 4 x 8 scenario (F = B = W = 10, hops 0.5 in a pipeline and
0.75 across, all-reduce 20, optimizer 2, memory 4 activations) with one failure per stage and per
pipeline: every pipeline is damaged, so dropping or dissolving is impossible, and the re-routing
candidates reached 414.25 ms against the proven bound 388.0.
"""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import given

import planner.candidates as candidates
from planner.candidates import SWEEP_POLICIES, best_heuristic, heuristic_policies
from planner.heuristic import list_schedule
from planner.routing import balanced_routing, lane_routing
from planner.simulator import replay
from planner.spec import JobSpec
from planner.sweep import sweep_schedule
from planner.validate import validate
from tests.planner.test_properties import SETTINGS, jobs_with_failures

SCENARIO = Path(__file__).resolve().parents[3] / "shared" / "scenarios" / "uniform-4x4x8.json"
SPREAD = ((0, 2), (1, 1), (2, 3), (3, 0))


def uniform_4x4x8() -> JobSpec:
    return JobSpec.parse(json.loads(SCENARIO.read_text()))


def test_the_chains_of_the_spread_4x4x8_case_by_hand():
    """Stage 0's survivors are pipelines 0, 1, 2, alive on their own pipeline for 2, 1 and 3 stages:
    chains start on 2, 0, 1. At stage 1 pipeline 1 is dead and 3 is the free survivor (chain
    1 -> 3); at stage 2 pipeline 0 is dead and 1 is free (0 -> 1); at stage 3 pipeline 2 is dead and
    0 is free (2 -> 0). The 32 micro-batches are dealt 11, 11, 10 in index order, so each worker
    serves its chain's count and the alive workers on no chain (none here: every stage has exactly
    three survivors) nothing."""
    job = uniform_4x4x8()
    routing = lane_routing(job, SPREAD)
    chain_a, chain_b, chain_c = (2, 2, 2, 0), (0, 0, 1, 1), (1, 3, 3, 3)
    expected = [[0] * 4 for _ in range(4)]
    for chain, count in ((chain_a, 11), (chain_b, 11), (chain_c, 10)):
        for s, p in enumerate(chain):
            expected[p][s] = count
    assert routing.load == expected
    # One chain per micro-batch: whoever serves it at stage 0 fixes who serves it everywhere.
    for home in range(4):
        for m in range(8):
            path = tuple(routing.executor(home, m, s) for s in range(4))
            assert path in (chain_a, chain_b, chain_c)


def test_the_spread_4x4x8_case_reaches_the_hand_worked_period():
    """Each chain is a 4-stage pipeline with one cross-pipeline hop each way. Stage 0's worker of an
    11-micro-batch chain can hold 4 forwards, and its first B arrives F + chain later, chain =
    3 (F + B) + 2 (0.5 + 0.5 + 0.75) = 63.5 ms: 10 + 63.5 - 4 x 10 = 33.5 ms idle before it; after
    its last F the B is again 63.5 ms away and it holds 3 micro-batches' B + W = 60 ms of work:
    3.5 ms idle. 11 x 30 + 20 + 2 + 33.5 + 3.5 = 389.0 ms, 0.26% above the bound 388.0, where the
    best candidate without the chains is 414.25 ms (measured when this was written)."""
    job = uniform_4x4x8()
    ops, period, name = best_heuristic(job, SPREAD)
    assert not validate(job, SPREAD, ops)
    assert abs(period - 389.0) < 1e-6, (period, name)
    assert name.startswith("lanes+")
    assert abs(replay(job, ops).iteration_ms - 389.0) < 1e-6


def test_without_the_chains_the_spread_case_stays_far_above(monkeypatch):
    """The same search with the chains switched off: the gap the chains close, more than the 1.03
    bar allows above 389.0 (414.25 ms when this was written; 402.75 since the extra micro-batches of
    an uneven deal go to peers not cut from their own pipeline, `balanced_routing`)."""
    monkeypatch.setattr(candidates, "lane_routing", lambda job, failed, spill=False: None)
    _, period, _ = best_heuristic(uniform_4x4x8(), SPREAD)
    assert period > 389.0 * 1.03


def test_chains_equal_to_dissolving_are_not_tried_twice():
    """One failure: the chains are the undamaged pipelines, which is dissolving the damaged one."""
    job = uniform_4x4x8()
    routing = lane_routing(job, ((1, 2),))
    assert routing.load[1] == [0, 0, 0, 0]
    assert all(routing.load[p] == [11, 11, 11, 11] or routing.load[p] == [10, 10, 10, 10]
               for p in (0, 2, 3))


@SETTINGS
@given(jobs_with_failures())
def test_chains_cover_every_micro_batch_once_per_stage_and_schedule_validly(case):
    """Any job and survivable failure set: every micro-batch runs at every stage on an alive worker,
    on one chain (the stage-0 worker fixes the rest), with exactly min_s alive_s workers per stage
    serving and their loads within one; the sweeps and list schedules on it are valid plans (the
    alive workers serving nothing still all-reduce and step: rule 5)."""
    job, failed = case
    routing = lane_routing(job, tuple(failed))
    if not failed:
        assert routing is None
        return
    D, S, M = job.pipelines, job.stages, job.microbatches
    dead = set(failed)
    lanes = min(sum((p, s) not in dead for p in range(D)) for s in range(S))
    paths = {}
    for home in range(D):
        for m in range(M):
            path = tuple(routing.executor(home, m, s) for s in range(S))
            assert all((p, s) not in dead for s, p in enumerate(path)), path
            assert paths.setdefault(path[0], path) == path
    for s in range(S):
        serving = [routing.load[p][s] for p in range(D) if routing.load[p][s]]
        assert sum(serving) == D * M
        assert len(serving) == min(lanes, D * M) and max(serving) - min(serving) <= 1
    for policy in [*SWEEP_POLICIES[:2], *heuristic_policies(job)[:2]]:
        make = sweep_schedule if hasattr(policy, "warmup_slack") else list_schedule
        ops = make(job, routing, policy)
        if ops is not None:
            assert not validate(job, tuple(failed), ops), policy.name


@SETTINGS
@given(jobs_with_failures())
def test_spilled_chains_use_every_survivor_and_schedule_validly(case):
    """With the spill: every micro-batch runs at every stage on an alive worker; a stage's workers
    on no chain serve too (each stage keeps all its survivors busy when it has at least as many
    micro-batches), no worker serves more than on the plain chains, and the sweeps and list
    schedules on it are valid plans."""
    job, failed = case
    if not failed:
        return
    plain = lane_routing(job, tuple(failed))
    routing = lane_routing(job, tuple(failed), spill=True)
    D, S, M = job.pipelines, job.stages, job.microbatches
    dead = set(failed)
    for home in range(D):
        for m in range(M):
            path = tuple(routing.executor(home, m, s) for s in range(S))
            assert all((p, s) not in dead for s, p in enumerate(path)), path
    for s in range(S):
        alive = [p for p in range(D) if (p, s) not in dead]
        assert sum(routing.load[p][s] for p in range(D)) == D * M
        if len(alive) <= D * M:
            assert all(routing.load[p][s] for p in alive), (s, routing.load)
        assert max(routing.load[p][s] for p in range(D)) <= max(plain.load[p][s] for p in range(D))
    for policy in [*SWEEP_POLICIES[:2], *heuristic_policies(job)[:2]]:
        make = sweep_schedule if hasattr(policy, "warmup_slack") else list_schedule
        ops = make(job, routing, policy)
        if ops is not None:
            assert not validate(job, tuple(failed), ops), policy.name


def test_a_spill_stride_that_shares_a_factor_with_the_chains_is_dealt_per_chain():
    """4 x 2 x 1 with stage 1 of pipelines 0 and 1 dead: two chains (2 and 3), and at stage 0 two
    workers on no chain. Dealing the 4 micro-batches in turn, every second one would spill, and
    every second one is the second chain's: it would keep none while the first keeps two (found by
    the suite's property test in CI). Each chain instead gives up its excess over an even share,
    1 of its 2: every stage-0 worker serves one."""
    job = JobSpec.parse({"pipelines": 4, "stages": 2, "microbatches": 1, "forward_ms": 1.0,
                         "backward_input_ms": 1.0, "backward_weight_ms": 1.0, "p2p_ms": 0.1,
                         "allreduce_ms": 1.0, "optimizer_ms": 1.0, "activation_mb": 1.0})
    routing = lane_routing(job, ((0, 1), (1, 1)), spill=True)
    assert [routing.load[p][0] for p in range(4)] == [1, 1, 1, 1]
    assert [routing.load[p][1] for p in range(4)] == [0, 0, 2, 2]


def test_the_spilled_chains_are_tried_only_with_failures_at_several_stages(monkeypatch):
    """With every failure at one stage the re-routing already keeps every survivor busy; the
    search asks for the spilled chains only where failures sit at two stages or more."""
    asked = []

    def recording(job, failed, spill=False):
        asked.append((tuple(failed), spill))
        return lane_routing(job, failed, spill=spill)

    monkeypatch.setattr(candidates, "lane_routing", recording)
    job = uniform_4x4x8()
    for failed in (((0, 1), (2, 1)), ((0, 1), (2, 2))):
        best_heuristic(job, failed, budget_s=0.0)
    assert (((0, 1), (2, 1)), True) not in asked
    assert (((0, 1), (2, 2)), True) in asked


def test_a_chain_continues_on_the_free_worker_alive_longest():
    """4 x 3 x 2 with (0, 1), (1, 0), (2, 0), (2, 2) dead: stage 0 keeps pipelines 0 and 3, so two
    chains (stage 0's two survivors; stage 1 has three, stage 2 three). Pipeline 3 stays alive to
    the end: one chain is 3, 3, 3. Pipeline 0 dies at stage 1, where 1 and 2 are free: 1 stays alive
    for 2 stages from there, 2 for 1 (it dies at stage 2), so the chain goes on 1 and stays: 0, 1, 1
    (through 2 it would need a second change of pipeline)."""
    job = JobSpec.parse({"pipelines": 4, "stages": 3, "microbatches": 2, "forward_ms": 1,
                         "backward_input_ms": 1, "backward_weight_ms": 1, "p2p_ms": 0.1,
                         "allreduce_ms": 1, "optimizer_ms": 1, "activation_mb": 1})
    routing = lane_routing(job, ((0, 1), (1, 0), (2, 0), (2, 2)))
    paths = {tuple(routing.executor(home, m, s) for s in range(3)) for home in range(4) for m in range(2)}
    assert paths == {(3, 3, 3), (0, 1, 1)}


def test_above_the_grid_size_the_chains_still_get_their_first_sweep(monkeypatch):
    """Above `HEURISTIC_GRID_MAX_OPS` only the first sweep of each routing runs (the 3 s bar at
    32 x 16 x 64); the chains are among them (there 8 spread failures: 3984.6 -> 3646.6 ms, the
    bound). Shrunk here so the spread 4 x 4 x 8 case counts as large: the first sweep of the chains
    is the 389.0 ms plan."""
    monkeypatch.setattr(candidates, "HEURISTIC_GRID_MAX_OPS", 10)
    job = uniform_4x4x8()
    ops, period, name = best_heuristic(job, SPREAD)
    assert not validate(job, SPREAD, ops)
    assert (period, name) == (389.0, f"lanes+{SWEEP_POLICIES[0].name}")


# Made-up job #0 of `benchmarks/gap_unseen.py --seed 34`, with one failure at each of stages 0-2.
SIX_BY_FOUR = {"pipelines": 6, "stages": 4, "microbatches": 22, "forward_ms": [2.2, 3.8, 2.2, 5.1],
               "backward_input_ms": [2.3, 4.2, 2.0, 5.0], "backward_weight_ms": [0.7, 1.6, 1.5, 4.4],
               "p2p_ms": 0.43, "cross_pipeline_p2p_ms": 2.48, "allreduce_ms": 29.7, "optimizer_ms": 0.8,
               "activation_mb": [3.9, 1.2, 3.9, 2.0], "activation_w_mb": [0.97, 0.9, 2.92, 1.0],
               "memory_limit_mb": 14.6}
SIX_BY_FOUR_FAILED = ((1, 1), (3, 0), (5, 2))


def test_the_workers_left_off_the_chains_take_an_even_share_when_spilled():
    """6 x 4 x 22 with (1, 1), (3, 0), (5, 2) dead: five survivors at stages 0-2, six at stage 3, so
    five chains. Stage 0's survivors 0, 2, 4 stay alive to the end, 5 for two stages, 1 for one:
    chains start on 0, 2, 4, 5, 1; at stage 1 pipeline 1 is dead and 3 is free (1 -> 3); at stage 2
    pipeline 5 is dead and 1 is free (5 -> 1). The 132 micro-batches are dealt 27, 27, 26, 26, 26.
    Stage 3's worker 5 is on no chain: without the spill it serves nothing and the chains' stage-3
    workers 27 or 26 each. Spilled, its share is 1/6: the dealing indices 5, 11, ..., 131 (22 of
    them), which fall on chain k mod 5 for index 6k + 5: 5, 5, 4, 4, 4 from the five chains, so
    every stage-3 worker serves exactly 22."""
    job = JobSpec.parse(SIX_BY_FOUR)
    chains = [(0, 0, 0, 0), (2, 2, 2, 2), (4, 4, 4, 4), (5, 5, 1, 1), (1, 3, 3, 3)]
    counts = [27, 27, 26, 26, 26]
    plain = lane_routing(job, SIX_BY_FOUR_FAILED)
    spilled = lane_routing(job, SIX_BY_FOUR_FAILED, spill=True)
    for s in range(3):
        expected = [0] * 6
        for chain, count in zip(chains, counts, strict=True):
            expected[chain[s]] = count
        assert [spilled.load[p][s] for p in range(6)] == expected
        assert [plain.load[p][s] for p in range(6)] == expected
    assert [plain.load[p][3] for p in range(6)] == [27, 26, 27, 26, 26, 0]
    assert [spilled.load[p][3] for p in range(6)] == [22] * 6
    from_chain = [0] * 5
    for home in range(6):
        for m in range(22):
            path = tuple(spilled.executor(home, m, s) for s in range(4))
            if path[3] == 5:
                from_chain[[c[:3] for c in chains].index(path[:3])] += 1
            else:
                assert path in chains
    assert from_chain == [5, 5, 4, 4, 4]


def test_spilled_chains_keep_the_widest_stage_busy():
    """The same case list-scheduled with one policy (the grid's first, `W=yield0.5,feed`): the
    chains alone leave a sixth of stage 3 idle and load the rest with 27, which bound 1 prices at
    27 x 14.5 + 30.5 = 422.0 ms (their period: 425.3); spilled, stage 3 carries 22 each and the
    period drops to 384.96 (bound 349.5). Re-routing the failed workers' micro-batches to their
    peers (the balanced routing) gives 410.11 with this policy (measured when this was written)."""
    job = JobSpec.parse(SIX_BY_FOUR)
    policy = heuristic_policies(job)[0]
    periods = {}
    for name, routing in (("chains", lane_routing(job, SIX_BY_FOUR_FAILED)),
                          ("spilled", lane_routing(job, SIX_BY_FOUR_FAILED, spill=True)),
                          ("balanced", balanced_routing(job, SIX_BY_FOUR_FAILED))):
        ops = list_schedule(job, routing, policy)
        assert not validate(job, SIX_BY_FOUR_FAILED, ops), name
        periods[name] = replay(job, ops).iteration_ms
    assert periods["chains"] >= 27 * 14.5 + 30.5 - 1e-6
    assert periods["spilled"] < min(periods["chains"], periods["balanced"]) * 0.97, periods
