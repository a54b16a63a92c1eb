"""`balanced_routing`: only the failed workers' micro-batches move, loads as even as they divide,
and where they cannot be equal the extra micro-batches go to peers whose own pipeline is alive on
both sides of them (a cut peer pays a cross-pipeline hop on every round trip of its own).
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from planner.routing import balanced_routing
from planner.spec import JobSpec

UNIT = {"forward_ms": 1.0, "backward_input_ms": 1.0, "backward_weight_ms": 1.0, "p2p_ms": 0.0,
        "allreduce_ms": 0.0, "optimizer_ms": 0.0, "activation_mb": 1.0}


@pytest.mark.parametrize("rotate", [0, 1, 2])
def test_extra_micro_batches_go_to_peers_not_cut_from_their_pipeline(rotate):
    # 4 pipelines x 3 stages x 2 micro-batches, (0, 1) and (1, 2) dead: each of those stages has 3
    # alive peers for 8 micro-batches, so two peers take 3 and one takes 2. Worker (1, 1) is cut
    # below (its pipeline's stage 2 is dead) and (0, 2) above (stage 1): each keeps the 2 it
    # has, whatever the rotation; pipelines 2 and 3 take one more at both stages. (Before: rotation
    # 0 gave the extras to the first two peers in index order, (1, 1) and (0, 2) among them.)
    job = JobSpec.parse({**UNIT, "pipelines": 4, "stages": 3, "microbatches": 2})
    routing = balanced_routing(job, ((0, 1), (1, 2)), rotate)
    assert [routing.load[p][1] for p in range(4)] == [0, 2, 3, 3]
    assert [routing.load[p][2] for p in range(4)] == [2, 0, 3, 3]
    assert [routing.load[p][0] for p in range(4)] == [2, 2, 2, 2]
    assert routing.busiest == [2, 3, 3]  # per stage, the most one alive worker runs


def _cut(dead: set, p: int, s: int) -> int:
    return ((p, s - 1) in dead) + ((p, s + 1) in dead)


@st.composite
def jobs_with_failures(draw):
    D, S, M = draw(st.integers(2, 6)), draw(st.integers(1, 5)), draw(st.integers(1, 7))
    # Any dead workers, as long as every stage keeps a survivor, and at least one dead.
    failed = [(p, s) for s in range(S)
              for p in draw(st.lists(st.integers(0, D - 1), max_size=D - 1, unique=True))]
    if not failed:
        failed = [(draw(st.integers(0, D - 1)), draw(st.integers(0, S - 1)))]
    job = JobSpec.parse({**UNIT, "pipelines": D, "stages": S, "microbatches": M})
    return job, tuple(sorted(failed)), draw(st.integers(0, 3))


@settings(max_examples=300, deadline=None, derandomize=True, database=None)
@given(jobs_with_failures())
def test_loads_are_even_and_extras_never_go_to_a_more_cut_peer(case):
    job, failed, rotate = case
    D, S, M = job.pipelines, job.stages, job.microbatches
    dead = set(failed)
    routing = balanced_routing(job, failed, rotate)
    for s in range(S):
        alive = [p for p in range(D) if (p, s) not in dead]
        for home in range(D):
            for m in range(M):
                executor = routing.executor(home, m, s)
                if (home, s) in dead:
                    assert executor in alive  # a dead worker's micro-batch moves to a peer
                else:
                    assert executor == home  # an alive worker keeps its own
        loads = {p: routing.load[p][s] for p in alive}
        assert sum(loads.values()) == D * M
        if len(alive) == D:
            continue
        base = D * M // len(alive)
        assert set(loads.values()) <= {base, base + 1}
        more = [p for p in alive if loads[p] == base + 1]
        fewer = [p for p in alive if loads[p] == base]
        assert all(_cut(dead, a, s) <= _cut(dead, b, s) for a in more for b in fewer), (loads, failed)
