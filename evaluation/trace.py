"""A day of training under a failure trace: who fails and rejoins when, and what each strategy keeps.

A trace is a list of (time, worker, fail|rejoin) events, read from or written to a CSV file with the
header `time_s,pipeline,stage,event`, or drawn as Poisson failures: every worker fails at rate
1 / MTBF while it is up, and rejoins a fixed repair time later.

Each strategy trains at its steady-state rate for the current failure set (strategies.py) between
events, and pays the pauses of `PauseModel` at each event. A failure set a strategy cannot train
under (e.g. Bamboo losing two neighbouring stages) makes it restart from its last checkpoint with
spares in the failed workers' places, like the checkpoint-restart strategy does at every failure.
"""

from __future__ import annotations

import csv
import math
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evaluation.strategies import Evaluator
from planner.failures import normalize
from planner.spec import JobSpec, SpecError, Worker

EVENT_KINDS = ("fail", "rejoin")
TRACE_HEADER = ("time_s", "pipeline", "stage", "event")


class TraceError(ValueError):
    """A trace file or trace option that cannot be used; the message names the line or option."""


@dataclass(frozen=True, order=True)
class Event:
    time_s: float
    worker: Worker
    kind: str


def write_trace(path: str | Path, events: list[Event]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        out = csv.writer(fh)
        out.writerow(TRACE_HEADER)
        for e in events:
            out.writerow([repr(e.time_s), e.worker[0], e.worker[1], e.kind])


def read_trace(path: str | Path, job: JobSpec) -> list[Event]:
    """Events sorted by time; every row checked against the job (TraceError names the line)."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TraceError(f"trace {path}: cannot read ({exc.__class__.__name__}: {exc})") from None
    rows = list(csv.reader(text.splitlines()))
    if not rows or tuple(c.strip() for c in rows[0]) != TRACE_HEADER:
        raise TraceError(f"trace {path}: line 1 must be the header {','.join(TRACE_HEADER)}")
    events = []
    for line, row in enumerate(rows[1:], start=2):
        if not row or all(not c.strip() for c in row):
            continue
        where = f"trace {path}: line {line}"
        if len(row) != 4:
            raise TraceError(f"{where}: expected 4 fields (time_s,pipeline,stage,event), got {len(row)}")
        try:
            t = float(row[0])
            p, s = int(row[1]), int(row[2])
        except ValueError:
            raise TraceError(f"{where}: time_s must be a number and pipeline, stage integers") from None
        kind = row[3].strip()
        if not math.isfinite(t) or t < 0:
            raise TraceError(f"{where}: time_s must be a finite number >= 0, got {row[0]}")
        if not (0 <= p < job.pipelines and 0 <= s < job.stages):
            raise TraceError(f"{where}: worker [{p}, {s}] is outside the {job.pipelines} x {job.stages} job")
        if kind not in EVENT_KINDS:
            raise TraceError(f"{where}: event must be fail or rejoin, got {kind!r}")
        events.append(Event(t, (p, s), kind))
    return sorted(events)


def poisson_trace(job: JobSpec, hours: float, mtbf_hours: float, repair_hours: float,
                  seed: int = 0) -> list[Event]:
    """Each worker fails after Exp(MTBF) hours of being up and rejoins `repair_hours` later."""
    if not (math.isfinite(hours) and hours > 0):
        raise TraceError(f"--hours: must be a positive number, got {hours}")
    if not (math.isfinite(mtbf_hours) and mtbf_hours > 0):
        raise TraceError(f"--mtbf-hours: must be a positive number, got {mtbf_hours}")
    if not (math.isfinite(repair_hours) and repair_hours >= 0):
        raise TraceError(f"--repair-hours: must be a number >= 0, got {repair_hours}")
    rng = random.Random(seed)
    end = hours * 3600.0
    events = []
    for worker in job.workers():
        t = 0.0
        while True:
            t += rng.expovariate(1.0 / (mtbf_hours * 3600.0))
            if t >= end:
                break
            events.append(Event(t, worker, "fail"))
            t += repair_hours * 3600.0
            if t < end:
                events.append(Event(t, worker, "rejoin"))
    return sorted(events)


# -------------------------------------------------------------------------------------- simulation


@dataclass
class StrategyDay:
    """What one strategy did over the trace."""

    strategy: str
    segments: list[tuple[float, float, float]] = field(default_factory=list)
    """(start_s, end_s, micro-batches per second) of useful training (lost work removed)."""
    time_in_plan_s: dict[str, float] = field(default_factory=dict)
    restarts: int = 0
    lost_s: float = 0.0
    """Training time thrown away by restarts (work since the last checkpoint)."""

    def useful_microbatches(self) -> float:
        return sum((b - a) * r for a, b, r in self.segments)

    def binned(self, duration_s: float, bin_s: float) -> list[float]:
        """Mean useful throughput (micro-batches/s) in consecutive bins of `bin_s` seconds."""
        n = max(1, math.ceil(duration_s / bin_s))
        out = [0.0] * n
        for a, b, r in self.segments:
            i = int(a // bin_s)
            while a < b and i < n:
                edge = min(b, (i + 1) * bin_s)
                out[i] += (edge - a) * r
                a, i = edge, i + 1
        return [v / min(bin_s, duration_s - i * bin_s) for i, v in enumerate(out)]


@dataclass
class PlanLookups:
    """How the adaptive strategy got each plan it switched to."""

    precomputed: int = 0
    """The class has at most `precompute_k` failures: a store filled before training holds it."""
    solved_live: int = 0
    """Seen for the first time and larger than the store: solved while training waits."""
    reused: int = 0
    """Solved live earlier in this trace, found in the store since."""
    live_wait_s: float = 0.0
    """Planning wall time (on this machine) that training waited for, summed over live solves."""
    last_live_s: float = field(default=0.0, repr=False)

    def as_json(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k != "last_live_s"}


def simulate_day(ev: Evaluator, events: list[Event], duration_s: float, strategies: list[str],
                 precompute_k: int = 1, progress: bool = True) -> tuple[dict[str, StrategyDay], PlanLookups]:
    """Replay the trace for every strategy; returns each one's day and the adaptive plan lookups."""
    from tqdm import tqdm

    job, pauses = ev.job, ev.pauses
    events = [e for e in events if e.time_s < duration_s]
    days = {name: StrategyDay(name) for name in strategies}
    lookups = PlanLookups()
    seen_live: set[str] = set()
    # Each strategy's own view: the failed workers it is running without (spares may replace some).
    failed: dict[str, set[Worker]] = {name: set() for name in strategies}
    resume_at = dict.fromkeys(strategies, 0.0)
    since = dict.fromkeys(strategies, 0.0)
    rate: dict[str, float] = {}
    label: dict[str, str] = {}
    for name in strategies:
        rate[name], label[name] = _rate(ev, name, ())

    def run_until(name: str, t: float) -> None:
        start = max(since[name], resume_at[name])
        day = days[name]
        if start < t and rate[name] > 0:
            day.segments.append((start, t, rate[name]))
        pause = min(t, resume_at[name]) - since[name]
        if pause > 0:
            day.time_in_plan_s["paused"] = day.time_in_plan_s.get("paused", 0.0) + pause
        if start < t:
            day.time_in_plan_s[label[name]] = day.time_in_plan_s.get(label[name], 0.0) + t - start
        since[name] = t

    def restart(name: str, t: float) -> None:
        """Roll back to the last checkpoint and continue with spares for every failed worker."""
        day = days[name]
        last = math.floor(t / pauses.checkpoint_interval_s) * pauses.checkpoint_interval_s
        kept = []
        for a, b, r in day.segments:
            if b <= last:
                kept.append((a, b, r))
            else:
                day.lost_s += b - max(a, last)
                if a < last:
                    kept.append((a, last, r))
        day.segments = kept
        day.restarts += 1
        failed[name].clear()
        resume_at[name] = max(resume_at[name], t) + pauses.restart_s

    bar = tqdm(events, desc=f"day on {job.pipelines * job.stages} GPUs", unit="event", disable=not progress)
    for e in bar:
        for name in strategies:
            run_until(name, e.time_s)
            mine = failed[name]
            if e.kind == "fail":
                resume_at[name] = max(resume_at[name], e.time_s) + pauses.detect_s
                if name == "checkpoint":
                    restart(name, e.time_s)
                    rate[name], label[name] = _rate(ev, name, ())
                    continue
                mine.add(e.worker)
            else:
                if e.worker not in mine:
                    continue  # a spare took its place: the repaired worker joins the spare pool
                mine.discard(e.worker)
            failed_now = tuple(sorted(mine))
            if name == "adaptive":
                _count_lookup(ev, failed_now, precompute_k, lookups, seen_live)
            new_rate, new_label = _rate(ev, name, failed_now)
            if new_rate == 0.0:
                restart(name, e.time_s)
                new_rate, new_label = _rate(ev, name, ())
            else:
                extra = pauses.regroup_s + (pauses.oobleck_copy_s if name == "oobleck" else 0.0)
                if name == "adaptive" and lookups.last_live_s:
                    extra += lookups.last_live_s
                resume_at[name] = max(resume_at[name], e.time_s) + extra
            rate[name], label[name] = new_rate, new_label
        bar.set_postfix(live=lookups.solved_live, pre=lookups.precomputed, reused=lookups.reused)
    for name in strategies:
        run_until(name, duration_s)
    return days, lookups


def _rate(ev: Evaluator, name: str, failed: tuple[Worker, ...]) -> tuple[float, str]:
    outcome = ev.outcome(name, failed)
    label = f"{len(failed)} failed: {outcome.detail}" if failed else "fault-free"
    return outcome.throughput(ev.job), label


def _count_lookup(ev: Evaluator, failed: tuple[Worker, ...], precompute_k: int, lookups: PlanLookups,
                  seen_live: set[str]) -> None:
    """Classify the plan lookup and time a live solve (the pause training waits for it)."""
    lookups.last_live_s = 0.0
    try:
        key = normalize(ev.job, failed).key
    except SpecError:
        return  # unplannable: the strategy restarts instead
    if len(failed) <= precompute_k:
        lookups.precomputed += 1
    elif key in seen_live:
        lookups.reused += 1
    else:
        seen_live.add(key)
        ev.outcome("adaptive", failed)
        lookups.last_live_s = ev.adaptive_wall_s(key)
        lookups.live_wait_s += lookups.last_live_s
        lookups.solved_live += 1
