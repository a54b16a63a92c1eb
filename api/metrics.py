"""Prometheus metrics, one registry per app (several apps in one process never collide)."""

from __future__ import annotations

import contextlib

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

_LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
_SOLVE_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300)


class Metrics:
    latency_bounds = _LATENCY_BUCKETS

    def __init__(self) -> None:
        self._flushers: list = []
        r = self.registry = CollectorRegistry()
        self.requests = Counter("recycle_http_requests", "HTTP requests served.",
                                ["method", "route", "status"], registry=r)
        self.request_seconds = Histogram("recycle_http_request_seconds", "Time to serve a request.",
                                         ["route"], buckets=_LATENCY_BUCKETS, registry=r)
        self.solve_seconds = Histogram("recycle_solve_seconds", "Wall time of one planner solve.",
                                       buckets=_SOLVE_BUCKETS, registry=r)
        self.solves = Counter("recycle_solves", "Planner solves finished.", ["outcome"], registry=r)
        self.pool_restarts = Counter("recycle_solve_pool_restarts", "Solve pools replaced (a process died "
                                     "or a solve overran its deadline).", registry=r)
        self.solves_in_flight = Gauge("recycle_solves_in_flight", "Solves running or queued.", registry=r)
        self.long_polls = Gauge("recycle_long_polls_waiting", "Assignment long-polls parked until a newer "
                                "generation (or their wait_s, or the server stopping).", registry=r)
        self.plan_lookups = Counter(
            "recycle_plan_lookups", "Plan requests: `hit` = a stored plan answered at once, `shared` = "
            "joined a solve already running, `miss` = started a solve.", ["result"], registry=r)
        self.generation = Gauge("recycle_generation", "Current membership generation.", ["job_id"],
                                registry=r)
        self.alive_workers = Gauge("recycle_alive_workers",
                                   "Registered workers with a fresh heartbeat, not in the failure set.",
                                   ["job_id"], registry=r)
        self.failed_workers = Gauge("recycle_failed_workers", "Workers in the current failure set.",
                                    ["job_id"], registry=r)

        self.cache_entries = Gauge("recycle_cache_entries", "Entries held by each bounded in-memory map.",
                                   ["cache"], registry=r)

    def before_export(self, flush) -> None:
        """`flush()` adds counts kept outside the registry (the head-answered heartbeats,
        `api.fastpath.HeadBeats`) before every export."""
        self._flushers.append(flush)

    def export(self) -> bytes:
        for flush in self._flushers:
            flush()
        return generate_latest(self.registry)

    @staticmethod
    def add_observations(histogram, counts: list[int], total: float) -> None:
        """Add `counts[i]` observations in bucket i (upper bound `latency_bounds[i]`, the last
        +Inf) summing to `total` to one labelled histogram, as that many `observe` calls would
        (prometheus_client keeps per-bucket counts, not cumulative ones)."""
        histogram._sum.inc(total)
        for bucket, n in zip(histogram._buckets, counts, strict=True):
            if n:
                bucket.inc(n)

    def watch_beat_loop(self, beat_loop) -> None:
        """The heartbeat thread's figures (`api.beat_loop.BeatLoop`), read at export."""
        gauge = Gauge("recycle_beat_thread", "Heartbeat thread: `connections` it serves now; since "
                      "start, connections `adopted`, beats `answered`, connections `handed_back` to the "
                      "main loop (a request it does not answer); how late its own 100 ms tick ran: "
                      "`late_max_ms`, and how many ticks were over 20 and 100 ms late.", ["count"],
                      registry=self.registry)
        gauge.labels("connections").set_function(lambda: len(beat_loop.connections))
        for name in ("adopted", "answered", "handed_back", "late_max_ms", "late_over_20ms",
                     "late_over_100ms"):
            gauge.labels(name).set_function(lambda name=name: getattr(beat_loop, name))

    def watch_size(self, cache: str, sized) -> None:
        self.cache_entries.labels(cache).set_function(lambda: len(sized))

    def forget_job(self, job_id: str) -> None:
        for gauge in (self.generation, self.alive_workers, self.failed_workers):
            with contextlib.suppress(KeyError):
                gauge.remove(job_id)
