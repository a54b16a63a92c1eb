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
            gc_pauses.install(window_s=0.4, longest_s=5.0)
            seen, frozen = {}, gc.get_freeze_count()
            gc_pauses.wake_up()
            seen["off"] = not gc.isenabled()
            survivors = [[i] for i in range(20_000)]  # tracked containers the wake-up keeps
            await asyncio.sleep(0.25)
            gc_pauses.wake_up()  # a second wake-up 0.25 s in: the window now ends 0.4 s after it
            await asyncio.sleep(0.3)
            seen["off_0.55_s_in"] = not gc.isenabled()
            await asyncio.sleep(0.4)
            seen["on_after"] = gc.isenabled()
            seen["frozen"] = gc.get_freeze_count() - frozen
            seen["kept"] = len(survivors)
            print(json.dumps(seen))

        asyncio.run(main())
        """)
    assert seen["off"] and seen["off_0.55_s_in"] and seen["on_after"], seen
    assert seen["frozen"] >= 20_000, seen  # the survivors left the collector's walk


def test_a_window_ends_by_its_longest_and_collection_off_by_choice_is_left_off():
    seen = _run("""
        import asyncio, gc, json, time
        from api import gc_pauses

        async def main():
            gc_pauses.install(window_s=0.3, longest_s=0.8)
            seen, started = {}, time.monotonic()
            while time.monotonic() - started < 3:
                gc_pauses.wake_up()  # a wake-up every 0.1 s: the window would never end by itself
                await asyncio.sleep(0.1)
                if gc.isenabled():
                    break
            seen["on_after_s"] = round(time.monotonic() - started, 2)
            gc_pauses.install()
            gc.disable()
            frozen = gc.get_freeze_count()
            gc_pauses.wake_up()
            survivors = [[i] for i in range(20_000)]
            await asyncio.sleep(0.1)
            gc_pauses._installed.release()
            seen["left_off"] = not gc.isenabled()
            seen["frozen_when_off"] = gc.get_freeze_count() - frozen
            seen["kept"] = len(survivors)
            print(json.dumps(seen))

        asyncio.run(main())
        """)
    assert 0.75 <= seen["on_after_s"] < 1.5, seen
    assert seen["left_off"] and seen["frozen_when_off"] <= 0, seen  # nothing frozen (some freed)


def test_the_service_holds_collection_through_a_generations_wake_up(tmp_path):
    with Server(f"sqlite:///{tmp_path / 'gc.db'}", tmp_path / "service.log") as server, server.client() as c:
        job = c.post("/v1/jobs", json=small_job()).json()["id"]
        first = c.get(f"/v1/jobs/{job}/workers/0/0/assignment", params={"wait_s": 60}).json()
        assert first["generation"] == 1
        wait_for(lambda: "garbage collection held through a wake-up" in server.log_tail(20_000), 30,
                 "the service to log the window it held through generation 1's answers")
