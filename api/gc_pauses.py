"""Keep the garbage collector's pauses out of a wake-up.

A collection holds the GIL, so while it runs no thread of the service answers anything, the
heartbeat thread (`api.beat_loop`) included. After a failure at 4,096 daemons the service creates
a few hundred thousand long-lived objects in about a second (4,095 answered polls and their
re-polls, parked for the next change), and with automatic collection on, young and middle
collections ran in the middle of that burst, walking all of them: 68-213 ms pauses logged by
`recycle serve` in one run, in which every heartbeat began in a 0.3 s window waited; with
collection off for a whole run, no beat waited more than 100 ms (docs/benchmarks.md).

So, once `install`ed (`recycle serve` does): `wake_up(workers)` - called by the coordinator when a
generation's answers are released - turns automatic collection off for a job of 512 workers or
more (a flood of small jobs' wake-ups in 60 s of abuse held it long enough to grow the server to
605 MB; with no window for them, that run stays under 100 MB), and ends the window at once,
unfrozen, if the process grows by 512 MB meanwhile; `window_s` after the last
wake-up (at most `longest_s` after the first) collection turns back on, and when the window was a
mass wake-up (`freeze_young` new objects or more, at most once per `freeze_every_s`) what it left
alive is frozen first (`gc.freeze`: moved out of every later collection's walk, in constant
time). Frozen objects are still freed by reference counting when unreferenced - the parked polls
are, at the next change - so only cyclic garbage made during a frozen window is never reclaimed:
the price, at most one window's every 2 s (and none from a window in which the process grew by
512 MB). (Nothing here counts the frozen objects:
`gc.get_freeze_count()` walks them all, 0.1-0.2 s at 4,096 daemons - itself a pause.)
"""

from __future__ import annotations

import asyncio
import gc
import os
import time

from api import logs

log = logs.get("service")


class WakeUpGC:
    def __init__(self, window_s: float = 3.0, longest_s: float = 15.0, freeze_young: int = 200_000,
                 freeze_every_s: float = 2.0, min_workers: int = 512, max_growth_mb: float = 512.0):
        self.window_s, self.longest_s = window_s, longest_s
        self.freeze_young, self.freeze_every_s = freeze_young, freeze_every_s
        self.min_workers, self.max_growth_mb = min_workers, max_growth_mb
        self._rss_at_start: float | None = None
        self._baseline_mb = _rss_mb()
        """Resident size after the last full collection (or freeze): see `tick`."""
        self._checked_at = 0.0
        self.since: float | None = None
        """When the current window began (collection off since then); None: no window."""
        self.frozen_at: float | None = None
        self._timer: asyncio.TimerHandle | None = None

    def wake_up(self, workers: int) -> None:
        """A generation's answers for a job of `workers` workers are going out now (on the event
        loop's thread). Jobs under `min_workers` open no window: their wake-ups are small, and a
        flood of them (jobs created and started in a loop) must not hold the collector."""
        if workers < self.min_workers:
            return
        now = time.monotonic()
        if self.since is None:
            if not gc.isenabled():
                return  # collection is off by someone else's choice: nothing to hold or give back
            gc.disable()
            self.since, self._rss_at_start = now, _rss_mb()
            asyncio.get_running_loop().call_later(GROWTH_CHECK_S, self._check_growth)
        if self._timer is not None:
            self._timer.cancel()
        delay_s = max(0.0, min(now + self.window_s, self.since + self.longest_s) - now)
        self._timer = asyncio.get_running_loop().call_later(delay_s, self.release)

    def tick(self) -> None:
        """Called often (the coordinator's watchdog): once a second, outside a window, a full
        collection when the process doubled (and grew by at least 512 MB) since the last one: a
        safety net for cyclic garbage that reached the old generation, rare enough not to fire on
        a large job's own growth (at a quarter it may have: a 4,096-daemon failure not precomputed
        showed a 0.9 s stall of the heartbeat thread, not explained). Logged with its pause."""
        now = time.monotonic()
        if self.since is not None or now - self._checked_at < 1.0:
            return
        self._checked_at = now
        rss = _rss_mb()
        if rss is None:
            return
        if self._baseline_mb is None:
            self._baseline_mb = rss
        if rss - self._baseline_mb < max(COLLECT_GROWTH_MIN_MB, COLLECT_GROWTH * self._baseline_mb):
            return
        started = time.perf_counter()
        found = gc.collect()
        self._baseline_mb = _rss_mb()
        log.info("full garbage collection: the service grew", extra={
            "seconds": round(time.perf_counter() - started, 3), "collected": found,
            "rss_mb_before": round(rss, 1), "rss_mb_after": round(self._baseline_mb or 0.0, 1)})

    def _check_growth(self) -> None:
        """While a window is open: if the process grew by `max_growth_mb` since it opened, end it
        now, unfrozen - whatever is allocating that fast is to be collected, not held."""
        if self.since is None:
            return
        rss = _rss_mb()
        if rss is not None and self._rss_at_start is not None \
                and rss - self._rss_at_start > self.max_growth_mb:
            log.warning("garbage collection window ended early: the service grew", extra={
                "grew_mb": round(rss - self._rss_at_start, 1)})
            self.release(freeze=False)
            return
        asyncio.get_running_loop().call_later(GROWTH_CHECK_S, self._check_growth)

    def release(self, freeze: bool = True) -> None:
        """End the window and turn collection back on; first freeze what the window left alive if
        that is a mass wake-up's survivors (at least `freeze_young` new tracked objects) and no
        window was frozen in the last `freeze_every_s`. Otherwise the collector takes the window's
        objects as usual: a window of small wake-ups - 722 jobs created and deleted in 60 s of
        abuse, each starting one - would freeze the abuse's cyclic garbage with them (a first
        version that froze every window grew the server to 1.7 GB in that run)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.since is None:
            return
        now = time.monotonic()
        young = gc.get_count()[0]  # tracked objects made and still alive since the last collection
        freeze = freeze and young >= self.freeze_young and (
            self.frozen_at is None or now - self.frozen_at >= self.freeze_every_s)
        if freeze:
            gc.freeze()
            self.frozen_at = now
            self._baseline_mb = _rss_mb()  # what the wake-up left alive is not growth to collect
        gc.enable()
        held_s, self.since = now - self.since, None
        log.info("garbage collection held through a wake-up", extra={
            "seconds": round(held_s, 3), "young": young, "frozen": freeze})


GROWTH_CHECK_S = 0.25
COLLECT_GROWTH, COLLECT_GROWTH_MIN_MB = 1.0, 512.0
_PAGE_MB = os.sysconf("SC_PAGE_SIZE") / 2**20 if hasattr(os, "sysconf") else 0.0


def _rss_mb() -> float | None:
    """Resident set size in MB (Linux `/proc`); None where it cannot be read."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE_MB
    except (OSError, ValueError, IndexError):
        return None


_installed: WakeUpGC | None = None


def install(window_s: float = 3.0, longest_s: float = 15.0, freeze_young: int = 200_000,
            freeze_every_s: float = 2.0, min_workers: int = 512, max_growth_mb: float = 512.0) -> WakeUpGC:
    """Turn the policy on for this process (one serving process per interpreter)."""
    global _installed
    _installed = WakeUpGC(window_s, longest_s, freeze_young, freeze_every_s, min_workers, max_growth_mb)
    return _installed


def tick() -> None:
    """Hook for the coordinator's watchdog: a no-op unless `install`ed."""
    if _installed is not None:
        _installed.tick()


def wake_up(workers: int) -> None:
    """Hook for the coordinator: a no-op unless `install`ed (tests that run an app in their own
    process keep the interpreter's collector as it is)."""
    if _installed is not None:
        _installed.wake_up(workers)
