"""Benchmark: 4,096 simulated worker daemons against one server (issue 9's scale bar).

Every daemon heartbeats at the service's default interval on one keep-alive connection and
long-polls its assignment on another, as executor daemons do (`executor/membership.py`): with the
job's worker token, the first beat registers (with its pid), later beats send no body and the
registration id. After a warm-up, one failure is
reported; measured: heartbeat latency percentiles over the whole run and the time from the report
until every alive daemon holds its new generation's instruction stream (assignment of the new
generation, which embeds the worker's stream). Two cases: the failure's plan precomputed and not.
Bars: heartbeat p99 < 100 ms; all hold the new stream < 3 s after a precomputed failure.

    python benchmarks/api_daemons.py [--pipelines 64 --stages 64 --microbatches 8] [--warmup 10]
        [--pin] [--ramp S] [--profile DIR]

`--pin` runs the load generator on CPU 0 and the server on CPU 1 (`taskset`), so neither steals the
other's core; the generator reports its own event-loop lag (how late a 10 ms timer fires): when that
lag is large, the latencies measure the generator, not the server. `--profile DIR` runs the server
under cProfile and writes one `.prof` per case.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

import httpx
from api_common import Connection, host_port, percentile, run_loop, scenario, start_service, stop_service

from executor.membership import alive_workers

TOKEN = "bench-admin-token-0123456789"
T0 = time.perf_counter()


def progress(what: str) -> None:
    print(f"[{time.perf_counter() - T0:7.1f} s] {what}", file=sys.stderr, flush=True)
ADMIN = {"Authorization": f"Bearer {TOKEN}"}


def cpu_s(pid: int | None) -> float:
    """CPU seconds (user + system) the process `pid` has used so far; 0 when unknown. On a box
    shared with other sessions, latencies move with their load; the server's CPU per beat does
    not (it counts only the time the server itself ran)."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def log_events(lines: list[str], events: tuple[str, ...], keys: tuple[str, ...] | None = None) -> list[dict]:
    """The service's JSON log lines whose event contains one of `events`, reduced to `keys`."""
    found = []
    for line in lines:
        if '"event"' not in line or not any(event in line for event in events):
            continue
        record = json.loads(line)
        if any(event in record.get("event", "") for event in events):
            found.append(record if keys is None else {k: v for k, v in record.items() if k in keys})
    return found


def answer_head(body: bytes) -> dict:
    """An assignment answer less `worker` and its stream, parsed without the stream: the service
    splices those two members in last (`api.assignment`), and a `"` inside a JSON string is always
    escaped, so the first `,"worker":[` is that member. Anything else is parsed whole."""
    cut = body.find(b',"worker":[')
    if cut > 0:
        try:
            return json.loads(body[:cut] + b"}")
        except ValueError:
            pass
    return json.loads(body)


class AliveCheck:
    """Whether an answer's alive set - the one the worker builds its groups from, derived as a
    daemon derives it (`alive_workers`) - is `expected`; derived once per distinct (pipelines,
    stages, failed), the whole input of the derivation. Real daemons derive it in parallel, each on
    its own machine; here 4,095 identical derivations of a 4,096-element list ran one after another
    on the generator's core (1.25 ms each measured under load), delaying the reading of every later
    answer, which the last daemon's hold time then included."""

    def __init__(self, expected: list[tuple[int, int]]):
        self.expected = expected
        self._verdicts: dict[tuple, bool] = {}

    def __call__(self, answer: dict) -> bool:
        shape = (answer["pipelines"], answer["stages"], tuple(map(tuple, answer["failed"])))
        verdict = self._verdicts.get(shape)
        if verdict is None:
            verdict = self._verdicts[shape] = alive_workers(answer) == self.expected
        return verdict


def slow_beats(beats: list[tuple[float, float]], since: float, until: float, reported: float,
               over_s: float = 0.1) -> dict:
    """The beats (begun within [since, until)) slower than `over_s`: how many, and when the first
    and the last of them began and were answered, in seconds from the failure report."""
    slow = [(at, latency) for at, latency in beats if since <= at < until and latency > over_s]
    if not slow:
        return {"count": 0}
    return {"count": len(slow), "first_begun_s": round(min(at for at, _ in slow) - reported, 3),
            "last_begun_s": round(max(at for at, _ in slow) - reported, 3),
            "last_answered_s": round(max(at + latency for at, latency in slow) - reported, 3)}


class BeatSide:
    """What the heartbeat side of the generator records (in the generator's process, or in a
    process of its own with `--beats-apart`)."""

    def __init__(self, host: str, port: int, job_id: str, token: str, interval: float):
        self.host, self.port, self.job_id, self.token, self.interval = host, port, job_id, token, interval
        self.beats: list[tuple[float, float]] = []  # (begun at, latency)
        self.registering: list[float] = []  # each daemon's first beat: it registers (a database write)
        self.errors = {"heartbeat": 0}
        self.lags: list[tuple[float, float]] = []  # (begun at, how late)
        self.stop = asyncio.Event()
        self.opened = asyncio.Semaphore(256)  # open the connections without a SYN flood

    async def connect(self) -> Connection:
        async with self.opened:
            return await Connection(self.host, self.port).open()

    async def lag_monitor(self) -> None:
        # How late a 10 ms sleep wakes up: the generator's own event-loop delay.
        while not self.stop.is_set():
            started = time.perf_counter()
            await asyncio.sleep(0.01)
            self.lags.append((started, time.perf_counter() - started - 0.01))

    async def heartbeat(self, worker, offset: float) -> None:
        p, s = worker
        conn = await self.connect()
        await asyncio.sleep(offset)  # spread the beats over the interval, as independent daemons are
        auth = {"Authorization": f"Bearer {self.token}"}
        path = f"/v1/jobs/{self.job_id}/workers/{p}/{s}/heartbeat"
        errors = self.errors
        while True:  # register; a refused or dropped attempt is counted and tried again
            started = time.perf_counter()
            try:
                status, answer = await conn.request("POST", path, {"pid": 1000 + p * 1000 + s}, auth)
            except (ConnectionError, asyncio.IncompleteReadError, IndexError):
                status, answer = -1, b""
            if status == 200:
                break
            errors[f"register_{status}"] = errors.get(f"register_{status}", 0) + 1
            await conn.close()
            conn = await self.connect()
        self.registering.append(time.perf_counter() - started)
        auth["X-Recycle-Registration"] = json.loads(answer)["registration"]
        while not self.stop.is_set():
            await asyncio.sleep(max(0.0, self.interval - (time.perf_counter() - started)))
            started = time.perf_counter()
            try:
                status, _ = await conn.request("POST", path, None, auth)
            except (ConnectionError, asyncio.IncompleteReadError, IndexError):
                status = -1  # closed by the server: counted, and beat again on a new connection
                await conn.close()
                conn = await self.connect()
            self.beats.append((started, time.perf_counter() - started))
            if status != 200:
                errors["heartbeat"] += 1
        await conn.close()

    def start(self, workers: list, ramp: float) -> list:
        n = len(workers)
        return [asyncio.ensure_future(self.heartbeat(w, ramp * i / n)) for i, w in enumerate(workers)]


def beat_process(url: str, job_id: str, token: str, workers: list, interval: float, ramp: float,
                 registered, stop, results) -> None:
    """`--beats-apart`: the heartbeat side in a process of its own, as each real daemon's heartbeat
    thread is apart from its assignment polling (`executor/membership.py`): beats are then not read
    after the pollers' handling of a wake-up's 4,095 answers on the same event loop."""
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    run_loop(_beat_side(url, job_id, token, workers, interval, ramp, registered, stop, results))


async def _beat_side(url, job_id, token, workers, interval, ramp, registered, stop, results) -> None:
    host, port = host_port(url)
    side = BeatSide(host, port, job_id, token, interval)
    monitor = asyncio.ensure_future(side.lag_monitor())
    beaters = side.start(workers, ramp)
    while len(side.registering) < len(workers):
        await asyncio.sleep(0.05)
    registered.set()
    while not stop.is_set():
        await asyncio.sleep(0.02)
    side.stop.set()
    await asyncio.wait_for(asyncio.gather(*beaters, monitor), timeout=60)
    results.send((side.beats, side.registering, side.errors, side.lags))


async def daemons(url: str, job_id: str, token: str, workers: list, failed: list, interval: float,
                  warmup: float, after: float, ramp: float, server_pid: int | None = None,
                  beats_apart: bool = False) -> dict:
    host, port = host_port(url)
    side = BeatSide(host, port, job_id, token, interval)
    beats, registering, errors, stop, lags = side.beats, side.registering, side.errors, side.stop, side.lags
    held: dict[tuple, float] = {}
    received: list[tuple[tuple, bytes]] = []  # each daemon's answer of the new generation, parsed
    # whole once the run is over: parsing 4,095 streams here, one after another on one core, took
    # 1.9 s (real daemons parse in parallel) and delayed reading every later answer and beat
    handling = [0.0]  # generator time parsing and checking assignment answers (a clean run: generation 2)
    monitor = asyncio.ensure_future(side.lag_monitor())
    connect = side.connect
    apart = None
    if beats_apart:
        context = multiprocessing.get_context("spawn")
        registered_flag, stop_flag = context.Event(), context.Event()
        receiving, sending = context.Pipe(duplex=False)
        apart = context.Process(target=beat_process, args=(url, job_id, token, workers, interval, ramp,
                                                           registered_flag, stop_flag, sending), daemon=True)
        apart.start()

    async def poll(worker) -> None:
        """Long-poll as `executor/membership.py` does: a newer generation is held, then the next
        poll (after it) goes out at once and parks until the run stops."""
        p, s = worker
        conn = await connect()
        after = 1
        while not stop.is_set():
            try:
                status, body = await conn.request(
                    "GET", f"/v1/jobs/{job_id}/workers/{p}/{s}/assignment?after={after}&wait_s=60", None,
                    {"Authorization": f"Bearer {token}"})
            except (ConnectionError, asyncio.IncompleteReadError, IndexError):
                if stop.is_set():
                    break
                status, body = -1, b""
            if status == 200:
                parsing = time.perf_counter()
                head = answer_head(body)
                # Held: an answer whose failure set has the reported worker (a generation the
                # start-up storm made, e.g. a worker failed by the watchdog, is not this one).
                if failed in head["failed"] and worker not in held:
                    held[worker] = time.perf_counter()
                    received.append((worker, body))
                after = max(after, head["generation"])
                handling[0] += time.perf_counter() - parsing
            elif status != 204:  # counted, then poll again on a new connection (as daemons do)
                errors[f"poll_{status}"] = errors.get(f"poll_{status}", 0) + 1
                await conn.close()
                conn = await connect()
        await conn.close()

    started_at = time.perf_counter()
    alive = [tuple(w) for w in workers if list(w) != failed]
    alive_check = AliveCheck(alive)
    n = len(workers)
    beaters = [] if apart is not None else side.start(workers, ramp)
    pollers = [asyncio.ensure_future(poll(w)) for w in alive]
    deadline = time.perf_counter() + 300

    def all_registered() -> bool:
        return registered_flag.is_set() if apart is not None else len(registering) >= n

    while not all_registered():  # the start-up storm: every daemon registers (a database write)
        assert time.perf_counter() < deadline, f"only {len(registering)} of {n} registered in 300 s"
        assert apart is None or apart.is_alive(), "the heartbeat process ended"
        await asyncio.sleep(0.05)
    registered_at = time.perf_counter()
    cpu_registered = cpu_s(server_pid)
    progress(f"all {n} daemons registered ({errors}); {warmup:g} s of steady beats, then the failure")
    await asyncio.sleep(warmup)
    steady_ended = time.perf_counter()
    steady_cpu = cpu_s(server_pid) - cpu_registered
    steady_wall = steady_ended - registered_at
    progress(f"steady window over: server CPU {steady_cpu:.2f} s of {steady_wall:.2f} s; "
             "reporting the failure")
    report = await Connection(host, port).open()
    status, body = await report.request("GET", f"/v1/jobs/{job_id}/membership", None, ADMIN)
    before = json.loads(body)
    if before["generation"] != 1:  # the measurement below would include those workers' changes
        errors["generations_before_the_failure"] = before["generation"] - 1
        progress(f"warning: generation {before['generation']} before the failure ({before['reason']})"[:300])
    reported = time.perf_counter()
    cpu_reported = cpu_s(server_pid)
    status, body = await asyncio.wait_for(
        report.request("POST", f"/v1/jobs/{job_id}/failures", {"worker": failed}, ADMIN), timeout=60)
    assert status == 200, body
    deadline = time.perf_counter() + 120
    while len(held) < len(alive):
        assert time.perf_counter() < deadline, f"only {len(held)} of {len(alive)} hold generation 2 in 120 s"
        await asyncio.sleep(0.01)
    wake_cpu = cpu_s(server_pid) - cpu_reported
    progress(f"all hold generation 2 after {max(held.values()) - reported:.3f} s "
             f"(server CPU {wake_cpu:.2f} s)")
    await asyncio.sleep(after)  # heartbeats keep going after the change
    stop.set()
    ended = time.perf_counter()
    await asyncio.wait_for(asyncio.gather(*beaters, monitor), timeout=60)
    beat_lags: list[tuple[float, float]] = lags
    if apart is not None:
        stop_flag.set()
        loop = asyncio.get_running_loop()
        beats, registering, beat_errors, beat_lags = await asyncio.wait_for(
            loop.run_in_executor(None, receiving.recv), timeout=120)
        errors.update(beat_errors)
        apart.join(30)
    for poller in pollers:  # parked in their next long-poll: nothing more to measure
        poller.cancel()
    await asyncio.gather(*pollers, return_exceptions=True)
    await report.close()
    for worker, body in received:  # what each daemon got, checked as a daemon reads it
        answer = json.loads(body)
        if failed not in answer["failed"] or answer["worker"] != list(worker):
            errors["held_wrong_answer"] = errors.get("held_wrong_answer", 0) + 1
        if not isinstance(answer.get("instructions"), dict):  # an InstructionStream, not null
            errors["held_no_stream"] = errors.get("held_no_stream", 0) + 1
        if not alive_check(answer):
            errors["wrong_alive"] = errors.get("wrong_alive", 0) + 1
    answer_bytes = [len(body) for _, body in received]
    # Steady state: every beat begun once all daemons had registered (the failure included).
    ms = [b * 1000 for at, b in beats if registered_at <= at < ended]
    window = sorted(b * 1000 for at, b in beats if registered_at <= at < steady_ended)
    lag_ms = [x * 1000 for _, x in lags]
    beat_lag_ms = [x * 1000 for _, x in beat_lags]

    def worst_lag_ms(samples: list[tuple[float, float]], since: float, until: float) -> float:
        return round(max((x * 1000 for at, x in samples if since <= at < until), default=0.0), 1)
    startup_ms = [b * 1000 for at, b in beats if at < registered_at] or [0.0]
    return {"beats_apart": beats_apart,
            "generator_loop_lag_p50_ms": round(percentile(lag_ms, 0.50), 2),
            "generator_loop_lag_p99_ms": round(percentile(lag_ms, 0.99), 2),
            "beat_generator_loop_lag_p99_ms": round(percentile(beat_lag_ms, 0.99), 2),
            # The longest either generator process was late between the report and 1 s after all held:
            # beats begun then waited on the generator itself (it shares one core with --pin).
            "wake_up_generator_lag_max_ms": {
                "polls": worst_lag_ms(lags, reported, max(held.values()) + 1.0),
                "beats": worst_lag_ms(beat_lags, reported, max(held.values()) + 1.0)},
            "all_registered_s": round(registered_at - started_at, 2),
            "registering_beat_p99_ms": round(percentile([r * 1000 for r in registering], 0.99), 2),
            "startup_heartbeat_p99_ms": round(percentile(startup_ms, 0.99), 2),
            "heartbeats_per_s": round(len(ms) / (ended - registered_at), 1),
            "daemons": n, "heartbeats": len(ms), "errors": errors,
            "steady_heartbeat_p50_ms": round(percentile(window, 0.50), 2),
            "steady_heartbeat_p99_ms": round(percentile(window, 0.99), 2),
            "steady_server_cpu_share": round(steady_cpu / steady_wall, 3) if server_pid else None,
            "steady_server_cpu_us_per_beat": round(steady_cpu / max(1, len(window)) * 1e6, 1)
            if server_pid else None,
            "wake_up_server_cpu_s": round(wake_cpu, 3) if server_pid else None,
            # When the beats over the bar began, from the failure report (seconds): which phase held them.
            "slow_beats": slow_beats(beats, registered_at, ended, reported),
            "heartbeat_p50_ms": round(percentile(ms, 0.50), 2),
            "heartbeat_p99_ms": round(percentile(ms, 0.99), 2), "heartbeat_max_ms": round(max(ms), 2),
            "all_hold_new_stream_s": round(max(held.values()) - reported, 3),
            "answer_bytes_p50": int(percentile(sorted(answer_bytes), 0.5)),
            "answer_bytes_total": sum(answer_bytes),
            "first_s": round(min(held.values()) - reported, 3),
            "generator_answer_handling_s": round(handling[0], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipelines", type=int, default=64)
    ap.add_argument("--stages", type=int, default=64)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--warmup", type=float, default=10.0, help="seconds of heartbeats before the failure")
    ap.add_argument("--after", type=float, default=3.0, help="seconds of heartbeats after all hold it")
    ap.add_argument("--cases", default="precomputed,not_precomputed")
    ap.add_argument("--pin", action="store_true", help="generator on CPU 0, server on CPU 1")
    ap.add_argument("--ramp", type=float, help="seconds over which the daemons start (default: one "
                    "heartbeat interval, all at once)")
    ap.add_argument("--profile", type=Path, help="run the server under cProfile, .prof files here")
    ap.add_argument("--slice-answers", action="store_true", help="RECYCLE_SLICE_ANSWERS=true for the server")
    ap.add_argument("--beats-apart", action="store_true",
                    help="the simulated daemons' heartbeats in a generator process of their own (on the "
                    "same CPU with --pin), apart from their assignment polls, as a daemon's heartbeat "
                    "thread is")
    ap.add_argument("--no-beat-thread", action="store_true",
                    help="RECYCLE_BEAT_THREAD=false: beats answered on the main event loop only")
    args = ap.parse_args()
    # The generator holds 8,192 connections and tasks: with the default thresholds its own full
    # collections paused it for 1.0-1.3 s (gc callbacks), which the beats it timed then included.
    gc.freeze()
    gc.set_threshold(50_000, 20, 100)
    launcher: tuple[str, ...] = (sys.executable,)
    if args.pin:
        os.sched_setaffinity(0, {0})
        launcher = ("taskset", "-c", "1", *launcher)
    spec = scenario("uniform-4x4x8.json", pipelines=args.pipelines, stages=args.stages,
                    microbatches=args.microbatches)
    workers = [(p, s) for p in range(args.pipelines) for s in range(args.stages)]
    failures = {"precomputed": [1, args.stages // 2], "not_precomputed": [2, args.stages // 3]}
    results = {}
    for case in args.cases.split(","):
        failed = failures[case]
        run_as = launcher
        if args.profile:
            args.profile.mkdir(parents=True, exist_ok=True)
            profiled = str(Path(__file__).with_name("profiled.py"))
            run_as = (*launcher, profiled, str(args.profile / f"{case}.prof"))
        extra = {"RECYCLE_SLICE_ANSWERS": "true"} if args.slice_answers else {}
        extra["RECYCLE_BEAT_THREAD"] = "false" if args.no_beat_thread else "true"
        proc, url, _tmp = start_service(run_as, RECYCLE_MAX_WAIT_S="300", RECYCLE_USE_CP="false", **extra,
                                        RECYCLE_SOLVE_DEADLINE_S="600", RECYCLE_API_TOKEN=TOKEN)
        try:
            with httpx.Client(base_url=url, timeout=300, headers=ADMIN) as c:
                created = c.post("/v1/jobs", json=spec).json()
                job_id, token = created["id"], created["worker_token"]
                first = c.get(f"/v1/jobs/{job_id}/workers/0/0/assignment", params={"wait_s": 300}).json()
                assert first["generation"] == 1, first
                interval = first.get("heartbeat_interval_s") or c.get(
                    f"/v1/jobs/{job_id}/membership").json()["heartbeat_interval_s"]
                progress(f"{case}: job {job_id} running generation 1")
                if case == "precomputed":
                    plan = c.post(f"/v1/jobs/{job_id}/plans", json={"failed": [failed], "wait_s": 300}).json()
                    assert plan["status"] == "done", plan
                    progress("failure's plan precomputed")
            results[case] = run_loop(daemons(url, job_id, token, workers, failed, interval, args.warmup,
                                             args.after, args.ramp if args.ramp is not None else interval,
                                             proc.pid, beats_apart=args.beats_apart))
        except BaseException:
            log = (Path(_tmp.name) / "service.log").read_text().splitlines()
            changes = [line for line in log if '"generation changed"' in line or '"level": "error"' in line]
            for line in changes[:20]:  # why the membership moved (failure lists cut short)
                print(line[:600], file=sys.stderr)
            print("\n".join(log)[-3000:], file=sys.stderr)
            raise
        finally:
            if case in results:  # what the heartbeat thread did (api.beat_loop)
                try:
                    text = httpx.get(f"{url}/metrics", headers=ADMIN, timeout=30).text
                    results[case]["server_beat_thread"] = {
                        line.split('"')[1]: float(line.split()[-1])
                        for line in text.splitlines() if line.startswith("recycle_beat_thread{")}
                except httpx.HTTPError as exc:
                    results[case]["server_beat_thread"] = f"metrics unreadable: {exc}"
            stop_service(proc)
            if case in results:  # the server's side of the wake-up: answers held back in slices
                log = (Path(_tmp.name) / "service.log").read_text().splitlines()
                results[case]["server_sliced_answers"] = log_events(log, ("answers sliced",))[:5]
                # collections over 50 ms, windows held (api.gc_pauses), and when the change came
                results[case]["server_gc"] = log_events(
                    log, ("garbage collection", "generation changed"),
                    ("ts", "event", "seconds", "generation", "young", "frozen", "collected"))
                results[case]["server_solves"] = log_events(  # the quick plan or the full solve
                    log, ("solve finished", "generation ready", "generation improved", "job warm-up skipped"),
                    ("ts", "event", "class", "status", "seconds", "plan", "generation"))
    print(json.dumps({"job": f"uniform {args.pipelines}x{args.stages}x{args.microbatches}",
                      "heartbeat_interval_s": interval, **results}, indent=2))


if __name__ == "__main__":
    main()
