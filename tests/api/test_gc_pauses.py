"""`api.gc_pauses`: automatic garbage collection is off through a wake-up and what the wake-up left
alive is frozen after it (issue 9: 68-213 ms collections during a 4,096-daemon wake-up held every
heartbeat, the heartbeat thread's too). The policy changes the interpreter's collector, so each
case runs in a fresh interpreter; `recycle serve` installs it (checked through its log)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from api_testkit import REPO, Server, small_job, wait_for


def _run(code: str) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_collection_is_off_through_a_wake_up_then_its_survivors_are_frozen():
    seen = _run("""
        import asyncio, gc, json
        from api import gc_pauses

        async def main():
            gc_pauses.install(window_s=1.0, longest_s=8.0, freeze_young=10_000)
            seen, frozen = {}, gc.get_freeze_count()
            gc_pauses.wake_up(4096)
            seen["off"] = not gc.isenabled()
            survivors = [[i] for i in range(20_000)]  # tracked containers the wake-up keeps
            await asyncio.sleep(0.6)
            gc_pauses.wake_up(4096)  # a second wake-up 0.6 s in: the window now ends 1 s after it
            await asyncio.sleep(0.7)
            seen["off_1.3_s_in"] = not gc.isenabled()  # past the first wake-up's 1 s
            await asyncio.sleep(1.5)
            seen["on_after"] = gc.isenabled()
            seen["frozen"] = gc.get_freeze_count() - frozen
            seen["kept"] = len(survivors)
            print(json.dumps(seen))

        asyncio.run(main())
        """)
    assert seen["off"] and seen["off_1.3_s_in"] and seen["on_after"], seen
    assert seen["frozen"] >= 20_000, seen  # the survivors left the collector's walk


def test_a_window_ends_by_its_longest_and_collection_off_by_choice_is_left_off():
    seen = _run("""
        import asyncio, gc, json, time
        from api import gc_pauses

        async def main():
            gc_pauses.install(window_s=1.0, longest_s=2.0)
            seen, started = {}, time.monotonic()
            while time.monotonic() - started < 6:
                gc_pauses.wake_up(4096)  # a wake-up every 0.1 s: the window would never end by itself
                await asyncio.sleep(0.1)
                if gc.isenabled():
                    break
            seen["on_after_s"] = round(time.monotonic() - started, 2)
            gc_pauses.install()
            gc.disable()
            frozen = gc.get_freeze_count()
            gc_pauses.wake_up(4096)
            survivors = [[i] for i in range(20_000)]
            await asyncio.sleep(0.1)
            gc_pauses._installed.release()
            seen["left_off"] = not gc.isenabled()
            seen["frozen_when_off"] = gc.get_freeze_count() - frozen
            seen["kept"] = len(survivors)
            print(json.dumps(seen))

        asyncio.run(main())
        """)
    assert 1.9 <= seen["on_after_s"] < 4.0, seen
    assert seen["left_off"] and seen["frozen_when_off"] <= 0, seen  # nothing frozen (some freed)


def test_only_a_mass_wake_up_is_frozen_and_at_most_once_per_interval():
    """Small windows (a job's 16 workers, or a flood of jobs each starting one) are not frozen: their
    cyclic garbage stays collectable (freezing every window grew a server to 1.7 GB under abuse)."""
    seen = _run("""
        import asyncio, gc, json
        from api import gc_pauses

        async def window(survivors: int) -> int:
            frozen = gc.get_freeze_count()
            gc_pauses.wake_up(4096)
            kept = [[i] for i in range(survivors)]
            await asyncio.sleep(0.6)  # the window (0.1 s) is over
            assert gc.isenabled() and len(kept) == survivors
            return gc.get_freeze_count() - frozen

        async def main():
            gc_pauses.install(window_s=0.1, longest_s=1.0, freeze_young=50_000, freeze_every_s=600)
            seen = {"small": await window(5_000), "mass": await window(60_000),
                    "mass_again": await window(60_000)}
            print(json.dumps(seen))

        asyncio.run(main())
        """)
    assert seen["small"] <= 0 and seen["mass"] >= 60_000 and seen["mass_again"] <= 0, seen


def test_a_window_that_grows_the_process_ends_early_unfrozen():
    seen = _run("""
        import asyncio, gc, json, time
        from api import gc_pauses

        async def main():
            gc_pauses.install(window_s=5.0, longest_s=10.0, freeze_young=1, max_growth_mb=64)
            frozen, started = gc.get_freeze_count(), time.monotonic()
            gc_pauses.wake_up(4096)
            gc_pauses.wake_up(16)  # a small job's wake-up neither opens nor extends a window
            ballast = bytearray(200 * 2**20)  # 200 MB, touched: the process grows
            while not gc.isenabled() and time.monotonic() - started < 4:
                await asyncio.sleep(0.05)
            print(json.dumps({"ended_after_s": round(time.monotonic() - started, 2),
                              "frozen": gc.get_freeze_count() - frozen, "kept": len(ballast)}))

        asyncio.run(main())
        """)
    assert seen["ended_after_s"] < 2.0 and seen["frozen"] <= 0, seen


def test_growth_outside_a_window_gets_a_full_collection():
    """Cyclic garbage that the service's rare collections leave waiting (here: none run at all) is
    collected once the process has doubled (and grown by at least 512 MB)."""
    seen = _run("""
        import gc, json, time
        from api import gc_pauses

        gc.set_threshold(10**9)  # no automatic collection: only `tick` can collect
        policy = gc_pauses.install()
        for _ in range(48):  # 48 cycles of 16 MB: garbage only a collection can free (768 MB)
            a, b = [bytearray(16 * 2**20)], []
            a.append(b); b.append(a)
        del a, b
        before = gc_pauses._rss_mb()
        policy._checked_at = 0.0
        gc_pauses.tick()
        print(json.dumps({"before": before, "after": gc_pauses._rss_mb()}))
        """)
    assert seen["before"] - seen["after"] > 600, seen


def test_the_service_holds_collection_through_a_large_jobs_wake_up_only(tmp_path):
    with Server(f"sqlite:///{tmp_path / 'gc.db'}", tmp_path / "service.log") as server, server.client() as c:
        small = c.post("/v1/jobs", json=small_job()).json()["id"]  # 16 workers: no window
        first = c.get(f"/v1/jobs/{small}/workers/0/0/assignment", params={"wait_s": 60}).json()
        assert first["generation"] == 1
        large = c.post("/v1/jobs", json=small_job(32, 16, 2)).json()["id"]  # 512 workers
        first = c.get(f"/v1/jobs/{large}/workers/0/0/assignment", params={"wait_s": 60}).json()
        assert first["generation"] == 1
        held = wait_for(lambda: [line for line in server.log_tail(50_000).splitlines()
                                 if "garbage collection held through a wake-up" in line], 30,
                        "the service to log the window it held through the large job's answers")
        assert len(held) == 1, held  # the small job's wake-up opened none
