"""The coordinator's pure state machine (`api.membership`) and its answer bytes (`api.assignment`),
with hand-worked cases: no server, no database, explicit clock.

Timeouts are the service defaults: beat every 1 s, failed after 5 s of silence, a peer's report
about a beating worker confirmed after max(2 x 1, 5 / 2) = 2.5 s of silence, "too slow" after
3 x 5 + 2.5 = 17.5 s of beating, never-registered after 60 s.
"""

from __future__ import annotations

import json

from api.assignment import Payload, StateBytes
from api.membership import FailureSet, Membership, Timeouts
from executor.membership import alive_workers

ALL = [(0, 0), (0, 1), (1, 0), (1, 1)]


def running(plan_id: str, objective_ms: float = 10.0):
    return plan_id, "done", {"objective_ms": objective_ms}, None


def alive(m: Membership) -> list[tuple[int, int]]:
    """The alive set a worker derives from this generation's answer (service bytes -> executor)."""
    return alive_workers(json.loads(Payload("j", m).head))


def started(pipelines: int = 2, stages: int = 2) -> Membership:
    m = Membership(pipelines, stages, Timeouts())
    assert m.set_failed((), "job started", now=0.0, bump=False) is True  # generation 1 needs its plan
    assert (m.generation, m.status, m.failed) == (1, "solving", ())
    m.plan_ready(*running("p1"))
    for w in ALL[: pipelines * stages]:
        m.beat(w, 0.0)
    return m


def test_two_failures_then_a_rejoin_walk_the_generations_by_hand():
    m = started()
    assert (m.generation, m.status, m.plan_id, m.iteration_ms) == (1, "running", "p1", 10.0)

    # 1. The launcher reports [1, 1] (no reporter): final at once -> generation 2, solving its plan.
    assert m.report((1, 1), None, now=1.0) is True
    assert m.change({(1, 1)}, "worker [1, 1] reported failed", now=1.0) is True
    assert (m.generation, m.failed, m.status, m.plan_id) == (2, ((1, 1),), "solving", None)
    assert not m.settled()
    m.plan_ready(*running("p2", 14.0))
    assert (m.status, m.plan_id, m.iteration_ms) == ("running", "p2", 14.0)
    # Reporting it again changes nothing.
    assert m.report((1, 1), None, now=1.2) is False
    assert m.change({(1, 1)}, "again", now=1.2) is None and m.generation == 2

    # 2. [0, 1] blames [0, 0], whose last beat (t=3.5) is fresh at t=4 (within 1.5 s): a suspicion.
    for w in ((0, 0), (0, 1), (1, 0)):
        m.beat(w, 3.5)
    assert m.report((0, 0), (0, 1), now=4.0) is False
    assert m.suspects == {(0, 0): 4.0}
    # [0, 1] and [1, 0] keep beating; [0, 0] is silent from 3.5 on.
    m.beat((0, 1), 6.0)
    m.beat((1, 0), 6.0)
    assert m.watch(6.4) == (set(), "")  # 2.4 s after the report: not yet confirmed (2.5 s)
    lost, why = m.watch(6.6)
    assert lost == {(0, 0)} and why == "reported by a peer and silent for 2.5 s since: [0, 0]"
    assert m.change(set(m.failed) | lost, why, now=6.6) is True
    assert (m.generation, m.failed, m.suspects) == (3, ((0, 0), (1, 1)), {})
    m.plan_ready(*running("p3"))
    # Each stage keeps one worker: [1, 0] on stage 0 and [0, 1] on stage 1.
    assert alive(m) == [(0, 1), (1, 0)]

    # 3. [1, 1] rejoins: generation 4 with only [0, 0] failed.
    assert m.change({(0, 0)}, "worker [1, 1] rejoined", now=7.0) is True
    assert (m.generation, m.failed, m.status) == (4, ((0, 0),), "solving")
    m.plan_ready(*running("p4"))
    assert alive(m) == [(0, 1), (1, 0), (1, 1)]


def test_a_stage_without_workers_waits_and_a_rejoin_brings_it_back():
    m = started()
    m.change({(0, 0)}, "a", now=1.0)
    m.plan_ready(*running("p2"))
    # [1, 0] goes too: stage 0 has nobody -> generation 3 waits (no plan), settled for long-polls.
    assert m.change({(0, 0), (1, 0)}, "b", now=2.0) is False
    assert (m.generation, m.status, m.plan_id) == (3, "waiting", None) and m.settled()
    assert m.reason.startswith("b; stage 0 has no alive worker")
    assert not m.streamed((0, 1))
    assert m.change({(1, 0)}, "worker [0, 0] rejoined", now=3.0) is True
    assert (m.generation, m.status) == (4, "solving")


def test_a_stall_of_the_service_is_not_the_workers_silence():
    m = started()
    m.beat((0, 0), 4.0)
    m.excuse(3.0)  # the service could not read beats for 3 s
    assert m.watch(7.5)[0] == set()  # 7.5 s after the last read beats, 4.5 s of it their silence
    assert m.watch(8.01)[0] == {(0, 1), (1, 0), (1, 1)}  # t=0 beats: 8.01 - 3 > 5
    assert m.watch(12.01)[0] == set(ALL)


def test_silence_past_the_timeout_and_never_registering():
    m = started()
    assert m.watch(5.0)[0] == set()  # exactly the timeout: not past it
    lost, why = m.watch(5.01)
    assert lost == set(ALL) and why == "missed heartbeats for 5 s: [0, 0], [0, 1], [1, 0], [1, 1]"

    m = Membership(2, 2, Timeouts())
    m.set_failed((), "job started", now=0.0, bump=False)
    m.beat((0, 0), 0.0)
    m.beat((0, 0), 59.0)
    assert m.watch(60.0)[0] == set()
    lost, why = m.watch(60.5)
    assert lost == {(0, 1), (1, 0), (1, 1)}
    assert why == "never registered within 60 s of the first: [0, 1], [1, 0], [1, 1]"
    assert m.all_registered is False and m.watch(60.6)[0] == {(0, 1), (1, 0), (1, 1)}


def test_a_beating_peer_reported_well_into_the_generation_is_too_slow_after_17_5_s():
    m = started()
    assert m.report((1, 1), (0, 1), now=3.0) is True  # silent for 3 s: not fresh, the report stands
    m.beat((1, 1), 2.5)
    assert m.report((1, 1), (0, 1), now=3.0) is False  # fresh, 3 s into the generation (>= 2.5 s)
    for t in range(3, 21):
        m.beat((1, 1), float(t))
        m.beat((0, 1), float(t))
        m.beat((0, 0), float(t))
        m.beat((1, 0), float(t))
    assert m.watch(20.4)[0] == set()  # 17.4 s after the report
    lost, why = m.watch(20.6)
    assert lost == {(1, 1)} and "too slow for its peers" in why


def test_a_report_just_after_a_change_counts_only_when_repeated_later():
    m = started()
    m.change({(1, 1)}, "a", now=10.0)
    m.plan_ready(*running("p2"))
    m.beat((0, 0), 10.5)
    assert m.report((0, 0), (0, 1), now=11.0) is False  # 1 s into generation 2: about the old groups
    for t in range(11, 30):
        for w in ((0, 0), (0, 1), (1, 0)):
            m.beat(w, float(t))
    assert m.watch(29.0)[0] == set()  # never "too slow": the report was about the old generation
    m.beat((0, 0), 29.0)
    assert m.report((0, 0), (0, 1), now=29.5) is False and m.suspects[(0, 0)] == 29.5  # repeated
    # A new generation forgets the suspicions: they were about the old generation's groups.
    m.change({(1, 1), (1, 0)}, "b", now=30.0)
    assert m.suspects == {}


def test_a_worker_reporting_itself_is_final_even_while_beating():
    m = started()
    m.beat((0, 0), 1.0)
    assert m.report((0, 0), (0, 0), now=1.1) is True and m.suspects == {}


def test_who_may_beat_for_a_registered_worker():
    m = started()
    m.sessions[(0, 0)] = "hash-of-process-a"
    m.beat((0, 0), 10.0)
    assert m.claim((0, 0), 11.0, owner=True) == "keep"
    assert m.claim((0, 0), 11.0, owner=False) == "refuse"  # process a beat 1 s ago
    assert m.claim((0, 0), 15.5, owner=False) == "mint"  # silent for 5.5 s: a restart takes over
    assert m.claim((0, 1), 11.0, owner=False) == "mint"  # nobody bound it yet
    m.change({(0, 0)}, "failed", now=12.0)
    assert m.claim((0, 0), 12.0, owner=False) == "mint"  # failed: its replacement may register


def test_answers_are_the_shared_head_with_each_workers_part_spliced_in():
    m = started()
    m.change({(1, 1)}, "worker [1, 1] reported failed", now=1.0)
    m.plan_ready(*running("p2", 12.5))
    head = {"job_id": "j", "generation": 2, "status": "running", "reason": "worker [1, 1] reported failed",
            "plan_id": "p2", "failed": [[1, 1]], "pipelines": 2, "stages": 2, "iteration_ms": 12.5,
            "heartbeat_interval_s": 1.0, "heartbeat_timeout_s": 5.0}
    payload = Payload("j", m)
    payload.streams[(0, 1)] = b'{"worker":[0,1],"instructions":[]}'
    assert json.loads(payload.body(m, (0, 1))) == {
        **head, "worker": [0, 1], "instructions": {"worker": [0, 1], "instructions": []}}
    excluded = json.loads(payload.body(m, (1, 1)))
    assert excluded["status"] == "excluded" and excluded["instructions"] is None
    assert excluded["worker"] == [1, 1] and "report a rejoin" in excluded["reason"]

    state = StateBytes()
    beat = json.loads(state.body("j", m, (0, 0)))
    expected = {k: v for k, v in head.items() if k not in ("pipelines", "stages")}
    assert beat == {**expected, "worker": [0, 0], "excluded": False}
    assert json.loads(state.body("j", m, (1, 1)))["excluded"] is True
    m.change(set(), "worker [1, 1] rejoined", now=2.0)  # a change is seen, not a stale copy
    m.plan_ready(*running("p3", 10.0))  # running again, as in generation 2
    again = json.loads(state.body("j", m, (0, 0)))
    assert (again["generation"], again["plan_id"], again["failed"]) == (3, "p3", [])
    m.change({(1, 1), (0, 0)}, "two failed", now=3.0)
    m.plan_ready(*running("p2b"))
    two = Payload("j", m)
    heads = {two.body(m, w)[:two.body(m, w).index(b',"worker"')] for w in ((1, 1), (0, 0))}
    assert len(heads) == 1  # every failed worker's answer is one shared head, serialized once


class CountingStore:
    """Stands in for `api.store.Store`: records each registration transaction."""

    def __init__(self) -> None:
        self.transactions: list[tuple[str, list]] = []

    def register_workers(self, job_id: str, rows: list) -> None:
        self.transactions.append((job_id, list(rows)))


def test_a_beat_writes_only_what_changes_and_registrations_together_share_a_transaction():
    import asyncio

    from api.membership_store import MembershipStore

    async def scenario() -> tuple[list, dict]:
        store = CountingStore()
        persist = MembershipStore(store)  # type: ignore[arg-type]
        records: dict = {}
        # 64 workers register at once (first beats with their pid): one transaction.
        await asyncio.gather(*(persist.record("j", (0, s), None, 1000 + s, f"h{s}", records)
                               for s in range(64)))
        after_register = len(store.transactions)
        # Later beats with nothing new (no body; or the same pid again) write nothing.
        for s in range(64):
            await persist.record("j", (0, s), None, None, None, records)
            await persist.record("j", (0, s), None, 1000 + s, None, records)
        assert len(store.transactions) == after_register
        # An address change is written, keeping the pid and the binding already stored.
        await persist.record("j", (0, 3), "10.0.0.3:29500", None, None, records)
        return store.transactions, records

    transactions, records = asyncio.run(scenario())
    assert len(transactions) == 2 and len(transactions[0][1]) == 64
    assert transactions[1] == ("j", [((0, 3), "10.0.0.3:29500", 1003, None)])
    assert records[(0, 3)] == ("10.0.0.3:29500", 1003, "h3")


def test_an_answer_does_not_grow_with_the_jobs_worker_count():
    """Every alive worker gets its answer after every change: its bytes must be the worker's own
    (its stream) plus the change (the failure set), not a list of the job's workers."""
    stream = b'{"worker":[0,1],"instructions":[]}'
    sizes = {}
    for pipelines, stages in ((2, 2), (64, 64)):
        m = started(pipelines, stages)
        m.change({(1, 1)}, "worker [1, 1] reported failed", now=1.0)
        m.plan_ready(*running("p2"))
        payload = Payload("j", m)
        payload.streams[(0, 1)] = stream
        answer, excluded = payload.body(m, (0, 1)), payload.body(m, (1, 1))
        assert alive_workers(json.loads(answer)) == [
            (p, s) for p in range(pipelines) for s in range(stages) if (p, s) != (1, 1)]
        sizes[pipelines] = len(answer), len(excluded)
    # 2 x 2 -> 64 x 64: only the digits of "pipelines" and "stages" grow (listing the 4,095 alive
    # workers added ~33 KB to each answer).
    assert sizes[64][0] - sizes[2][0] == 2 and sizes[64][1] - sizes[2][1] == 2, sizes


def test_the_failure_set_is_a_sorted_tuple_with_set_lookups():
    failed = FailureSet([(1, 0), (0, 1), (1, 0)])
    assert failed == ((0, 1), (1, 0)) and isinstance(failed, tuple) and len(failed) == 2
    assert (1, 0) in failed and (1, 1) not in failed and (1, 0) in FailureSet([[1, 0]])  # stored as lists

    class Probe:  # counts the comparisons `in` makes: a tuple scan compares with every member
        compared = 0

        def __hash__(self) -> int:
            return hash((99, 99))  # no member has this hash

        def __eq__(self, other) -> bool:
            Probe.compared += 1
            return False

    big = FailureSet((p, s) for p in range(64) for s in range(64))
    assert Probe() not in big and Probe.compared == 0  # one hash lookup, whatever the failure count
    m = started()
    m.change({(1, 1)}, "x", now=1.0)
    assert isinstance(m.failed, FailureSet) and (1, 1) in m.failed
