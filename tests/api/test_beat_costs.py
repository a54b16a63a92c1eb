"""What made a heartbeat cheaper must not make it less checked (issue 9, 4,096 daemons):
a keep-alive connection reuses a worker caller only for byte-identical credentials of the same job
(`api.fastpath.worker_caller`), head-answered beats are still counted and timed in the request
metrics (`Metrics.add_observations`, flushed before an export), and long-poll answers after a
change go out in slices with the sockets read between them (`api.turns`)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from prometheus_client import generate_latest

from api.fastpath import worker_caller
from api.metrics import Metrics
from api.tokens import registration_hash, worker_token
from api.turns import Turns

SECRET = "admin-secret-0123456789abcdef"


def beat_headers(token: str, registration: str | None = "reg-1") -> list[tuple[bytes, bytes]]:
    headers = [(b"host", b"t"), (b"content-length", b"0"), (b"authorization", f"Bearer {token}".encode())]
    if registration is not None:
        headers.append((b"x-recycle-registration", registration.encode()))
    return headers


def test_a_connection_reuses_a_caller_only_for_identical_credentials_of_the_same_job():
    good_a, good_b = worker_token(SECRET, "job-a"), worker_token(SECRET, "job-b")
    memo: dict = {}
    first = worker_caller(SECRET, beat_headers(good_a), "job-a", bodiless=True, memo=memo)
    assert first is not None and not first.admin and first.job_id == "job-a"
    assert first.registration == "reg-1" and first.registration_sha == registration_hash("reg-1")
    # The same bytes again: the same caller, without recomputing the HMAC.
    assert worker_caller(SECRET, beat_headers(good_a), "job-a", bodiless=True, memo=memo) is first
    # A forged token on the same connection is checked in full and refused.
    forged = good_a[:-1] + ("0" if good_a[-1] != "0" else "1")
    assert worker_caller(SECRET, beat_headers(forged), "job-a", bodiless=True, memo=memo) is None
    # The proven token of job a, sent for job b's route: refused, not served from the memo.
    memo = {}
    assert worker_caller(SECRET, beat_headers(good_a), "job-a", bodiless=True, memo=memo) is not None
    assert worker_caller(SECRET, beat_headers(good_a), "job-b", bodiless=True, memo=memo) is None
    # Another registration id on the same connection: a caller of its own (owns() decides).
    other = worker_caller(SECRET, beat_headers(good_a, "reg-2"), "job-a", bodiless=True, memo=memo)
    assert other is not None and other.registration == "reg-2"
    assert other.owns(registration_hash("reg-2")) and not other.owns(registration_hash("reg-1"))
    # Job b's own token still works on that connection.
    assert worker_caller(SECRET, beat_headers(good_b), "job-b", bodiless=True, memo=memo).job_id == "job-b"


def test_a_memo_never_admits_what_a_fresh_check_refuses():
    """Every sequence of credentials on one connection gets the same verdict as without a memo."""
    tokens = [worker_token(SECRET, "job-a"), worker_token(SECRET, "job-b"), "rw1.job-a.00", SECRET, ""]
    sequence = [(t, j, r) for t in tokens for j in ("job-a", "job-b") for r in ("reg-1", None)]
    memo: dict = {}
    for token, job, registration in sequence * 2:
        fresh = worker_caller(SECRET, beat_headers(token, registration), job, bodiless=True)
        memoized = worker_caller(SECRET, beat_headers(token, registration), job, bodiless=True, memo=memo)
        assert (fresh is None) == (memoized is None), (token, job, registration)
        if fresh is not None:
            assert (fresh.admin, fresh.job_id, fresh.registration) == \
                (memoized.admin, memoized.job_id, memoized.registration)


def test_batched_observations_export_as_the_same_observations_one_by_one():
    seconds = [0.0004, 0.001, 0.0011, 0.003, 0.05, 0.2, 7.0, 100.0, 0.0]
    one_by_one, batched = Metrics(), Metrics()
    for s in seconds:
        one_by_one.request_seconds.labels("/r").observe(s)
    bounds = Metrics.latency_bounds
    counts = [0] * (len(bounds) + 1)
    for s in seconds:  # the bucket a value falls in: the first upper bound not below it
        counts[next((i for i, b in enumerate(bounds) if s <= b), len(bounds))] += 1
    Metrics.add_observations(batched.request_seconds.labels("/r"), counts, sum(seconds))

    def histogram_lines(m: Metrics) -> list[str]:
        return [line for line in generate_latest(m.registry).decode().splitlines()
                if line.startswith("recycle_http_request_seconds") and "created" not in line]

    assert histogram_lines(batched) == histogram_lines(one_by_one) and len(histogram_lines(batched)) > 10


def test_export_flushes_what_was_counted_outside_the_registry():
    m = Metrics()
    pending = [3]

    def flush() -> None:
        m.requests.labels("POST", "/r", "200").inc(pending[0])
        pending[0] = 0

    m.before_export(flush)
    assert b'recycle_http_requests_total{method="POST",route="/r",status="200"} 3.0' in m.export()
    assert b'recycle_http_requests_total{method="POST",route="/r",status="200"} 3.0' in m.export()


class TurnsLoop:
    """Callers passing through `turns` on the running loop, each recorded with the loop iteration it
    went through in (one `call_soon` chain link per iteration). `each_iteration` and `each_caller`
    advance the tests' fake clocks: the loop's other work, and a caller's once it is through."""

    def __init__(self, turns: Turns, each_iteration=lambda: None, each_caller=lambda: None):
        self.turns, self.each_iteration, self.each_caller = turns, each_iteration, each_caller
        self.passed: list[tuple[int, int]] = []
        self.iteration, self.stop = 0, asyncio.Event()

    def start(self) -> None:
        self.stop.clear()
        asyncio.get_running_loop().call_soon(self._tick)

    def _tick(self) -> None:
        self.iteration += 1
        self.each_iteration()
        if not self.stop.is_set():
            asyncio.get_running_loop().call_soon(self._tick)

    async def _take(self, i: int) -> None:
        await self.turns.take()
        self.passed.append((i, self.iteration))
        self.each_caller()

    async def take_all(self, callers: int) -> None:
        await asyncio.wait_for(asyncio.gather(*(self._take(i) for i in range(callers))), 5)

    def order(self) -> list[int]:
        return [i for i, _ in self.passed]

    def slices(self) -> list[int]:
        """How many callers went through in each iteration that let any through, in order."""
        sizes: dict[int, int] = {}
        for _, it in self.passed:
            sizes[it] = sizes.get(it, 0) + 1
        return [sizes[it] for it in sorted(sizes)]


def test_turns_let_a_share_through_per_loop_iteration_in_arrival_order():
    async def run():
        loop = TurnsLoop(Turns(2))
        loop.start()
        await loop.take_all(7)
        loop.stop.set()
        assert loop.order() == list(range(7))
        assert max(loop.slices()) <= 2 and len(loop.slices()) >= 4
    asyncio.run(run())


def test_a_slice_ends_when_its_time_budget_is_used():
    """Each caller "takes" one unit of a fake clock once through: with a budget of 3 units, a
    slice holds at most 4 callers (the one that starts it at 0, and those through at 1, 2, 3),
    fewer than the count (5) allows; order is kept across the cut."""
    async def run():
        now = [0.0]
        loop = TurnsLoop(Turns(5, budget_s=3.0, clock=lambda: now[0]),
                         each_caller=lambda: now.__setitem__(0, now[0] + 1.0))
        loop.start()
        await loop.take_all(10)
        loop.stop.set()
        assert loop.order() == list(range(10))
        assert max(loop.slices()) == 4 and len(loop.slices()) == 3, loop.slices()
    asyncio.run(run())


def test_a_busy_loop_gives_the_slices_as_long_as_the_rest_up_to_the_most():
    """Every loop iteration spends 5 units on other work (the beats); each caller 1 unit. The
    first slice of a backlog gets the base budget (2: callers at 0, 1, 2), later ones as long as
    the other work since the previous slice (10 or more), capped at 4: callers at 0 .. 4."""
    async def run():
        now = [0.0]
        loop = TurnsLoop(Turns(100, budget_s=2.0, max_budget_s=4.0, clock=lambda: now[0]),
                         each_iteration=lambda: now.__setitem__(0, now[0] + 5.0),
                         each_caller=lambda: now.__setitem__(0, now[0] + 1.0))
        loop.start()
        await asyncio.sleep(0)
        await loop.take_all(13)
        loop.stop.set()
        assert loop.order() == list(range(13))
        assert loop.slices() == [3, 5, 5], loop.slices()
        # A later backlog starts at the base budget again, however busy the loop was meanwhile.
        loop.start()
        for _ in range(3):
            await asyncio.sleep(0)
        loop.passed.clear()
        await loop.take_all(5)
        loop.stop.set()
        passed = loop.passed
        assert len({it for _, it in passed[:3]}) == 1 and passed[3][1] > passed[2][1], passed
    asyncio.run(run())


def test_a_backlog_older_than_hurry_after_goes_at_once():
    """Two a slice while the backlog is young (a fake wall clock advances 1 per iteration); once it
    is older than 5, everything still waiting goes in one slice: the wake-up is bounded even when
    the slices get little of a starved loop."""
    async def run():
        wall, cpu = [0.0], [0.0]  # each caller through takes 1 unit of CPU; a slice's budget is 1.5
        turns = Turns(2, budget_s=1.5, hurry_after_s=5.0, clock=lambda: cpu[0], wall=lambda: wall[0])
        drained = []
        turns.drained = lambda n, seconds, hurried: drained.append((n, seconds, hurried))
        loop = TurnsLoop(turns, each_iteration=lambda: wall.__setitem__(0, wall[0] + 1.0),
                         each_caller=lambda: cpu.__setitem__(0, cpu[0] + 1.0))
        loop.start()
        await asyncio.sleep(0)
        await loop.take_all(30)
        assert loop.order() == list(range(30))
        counts = loop.slices()  # hurried: past the count and the budget
        assert all(n <= 2 for n in counts[:-1]) and counts[-1] > 2 and 4 <= len(counts) <= 8, counts
        for _ in range(3):  # the backlog is over; the wall clock goes on
            await asyncio.sleep(0)
        loop.passed.clear()
        await loop.take_all(6)
        loop.stop.set()
        assert loop.slices() == [2, 2, 2], loop.slices()  # a new backlog is young again
        # Each backlog reported once, with those that waited (all but the first slice's two).
        assert [n for n, _, _ in drained] == [28, 4] and all(seconds > 0 for _, seconds, _ in drained)
        assert drained[0][2] == counts[-1] and drained[1][2] == 0  # the hurried slice, none later
    asyncio.run(run())


def test_a_cancelled_waiter_gives_its_place_up():
    async def run():
        turns, passed = Turns(1), []

        async def taker(i: int) -> None:
            await turns.take()
            passed.append(i)

        tasks = [asyncio.ensure_future(taker(i)) for i in range(4)]
        await asyncio.sleep(0)  # all four have arrived: 0 passed, 1-3 wait
        tasks[1].cancel()
        await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 5)
        assert passed == [0, 2, 3] and turns.waiting == 0
    asyncio.run(run())


@pytest.mark.parametrize("loop_factory", ["asyncio", "uvloop"])
def test_sockets_are_read_between_the_slices_of_a_wake_up(loop_factory):
    """The point of `Turns`: 40 long-polls woken at once (one event, as after a change) answer in
    slices, and a beat arriving on a socket mid-burst (sent when the 10th answer goes out) is
    read before the burst ends, not after all of it."""
    async def run():
        loop = asyncio.get_running_loop()
        turns, order, change = Turns(4), [], asyncio.Event()
        reader, writer = socket.socketpair()
        reader.setblocking(False)
        loop.add_reader(reader.fileno(), lambda: (order.append("beat"), reader.recv(64),
                                                 loop.remove_reader(reader.fileno())))

        async def answer(i: int) -> None:
            await change.wait()
            await turns.take()
            order.append(i)
            if len(order) == 10:
                writer.send(b"POST /beat")

        try:
            polls = asyncio.gather(*(answer(i) for i in range(40)))
            await asyncio.sleep(0)
            change.set()
            await asyncio.wait_for(polls, 5)
            for _ in range(3):  # without slices the beat is read only now
                await asyncio.sleep(0)
        finally:
            loop.remove_reader(reader.fileno())
            reader.close()
            writer.close()
        assert "beat" in order and order.index("beat") < 24, order
    if loop_factory == "uvloop":
        uvloop = pytest.importorskip("uvloop")
        uvloop.run(run())
    else:
        asyncio.run(run())
