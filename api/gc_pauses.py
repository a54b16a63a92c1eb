"""Keep the garbage collector's pauses out of a wake-up.

A collection holds the GIL, so while it runs no thread of the service answers anything, the
heartbeat thread (`api.beat_loop`) included. After a failure at 4,096 daemons the service creates
a few hundred thousand long-lived objects in about a second (4,095 answered polls and their
re-polls, parked for the next change), and with automatic collection on, young and middle
collections ran in the middle of that burst, walking all of them: 68-213 ms pauses logged by
`recycle serve` in one run, in which every heartbeat began in a 0.3 s window waited; with
collection off for a whole run, no beat waited more than 100 ms (docs/benchmarks.md).

So, once `install`ed (`recycle serve` does): `wake_up()` - called by the coordinator when a
generation's answers are released - turns automatic collection off; `window_s` after the last
wake-up (at most `longest_s` after the first), everything the wake-up left alive is frozen
(`gc.freeze`: moved out of every later collection's walk, in constant time) and collection turns
back on. Frozen objects are still freed by reference counting when unreferenced - the parked
polls are, at the next change - so only cyclic garbage made during the window is never reclaimed:
the price, bounded by what one window allocates. (Nothing here counts the frozen objects:
`gc.get_freeze_count()` walks them all, 0.1-0.2 s at 4,096 daemons - itself a pause.)
"""

from __future__ import annotations

import asyncio
import gc
import time

from api import logs

log = logs.get("service")


class WakeUpGC:
    def __init__(self, window_s: float = 3.0, longest_s: float = 10.0):
        self.window_s, self.longest_s = window_s, longest_s
        self.since: float | None = None
        """When the current window began (collection off since then); None: no window."""
        self._timer: asyncio.TimerHandle | None = None

    def wake_up(self) -> None:
        """A generation's answers are going out now (on the event loop's thread)."""
        now = time.monotonic()
        if self.since is None:
            if not gc.isenabled():
                return  # collection is off by someone else's choice: nothing to hold or give back
            gc.disable()
            self.since = now
        if self._timer is not None:
            self._timer.cancel()
        delay_s = max(0.0, min(now + self.window_s, self.since + self.longest_s) - now)
        self._timer = asyncio.get_running_loop().call_later(delay_s, self.release)

    def release(self) -> None:
        """End the window: freeze what it left alive and turn collection back on."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self.since is None:
            return
        gc.freeze()
        gc.enable()
        held_s, self.since = time.monotonic() - self.since, None
        log.info("garbage collection held through a wake-up", extra={"seconds": round(held_s, 3)})


_installed: WakeUpGC | None = None


def install(window_s: float = 3.0, longest_s: float = 10.0) -> WakeUpGC:
    """Turn the policy on for this process (one serving process per interpreter)."""
    global _installed
    _installed = WakeUpGC(window_s, longest_s)
    return _installed


def wake_up() -> None:
    """Hook for the coordinator: a no-op unless `install`ed (tests that run an app in their own
    process keep the interpreter's collector as it is)."""
    if _installed is not None:
        _installed.wake_up()
