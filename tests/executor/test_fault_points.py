"""The fault-injection seam (executor/fault_points.py) against a real c10d store."""

from __future__ import annotations

import datetime
import threading
import time

import torch.distributed as dist

from executor.fault_points import FaultPoints, hold_release_key, pause_positions, reached_key, release_key


def test_pause_positions_are_the_middle_occurrence_of_each_phase():
    ops = ["F", "F", "F", "B", "W", "B", "W", "ALLREDUCE", "OPTIMIZER"]
    # F at 0,1,2 -> 1; B at 3,5 -> 5 (index len//2 = 1); W at 4,6 -> 6; one ALLREDUCE, one OPTIMIZER
    assert pause_positions(ops) == {1: "forward", 5: "backward_input", 6: "backward_weight",
                                    7: "allreduce", 8: "optimizer"}
    assert pause_positions(["SEND", "RECV"]) == {}


def test_a_worker_without_points_gets_no_seam():
    assert FaultPoints.of(None, (0, 0), [], [], 1.0, threading.Event()) is None


def _store():
    return dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                         timeout=datetime.timedelta(seconds=10))


def test_pause_announces_itself_and_waits_for_the_release():
    store = _store()
    faults = FaultPoints.of(store, (1, 2), ["3:backward_input"], [], 10.0, threading.Event())
    faults.pause(2, "backward_input")  # not asked for: returns at once, announces nothing
    assert not store.check([reached_key((1, 2))])
    done = threading.Event()
    waiter = threading.Thread(target=lambda: (faults.pause(3, "backward_input"), done.set()))
    waiter.start()
    deadline = time.monotonic() + 10
    while not store.check([reached_key((1, 2))]) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert store.get(reached_key((1, 2))).decode() == "3:backward_input"
    assert not done.wait(0.2)  # still paused: the launcher has not released it
    store.set(release_key((1, 2), "3:backward_input"), "1")
    assert done.wait(10)
    waiter.join(10)


def test_hold_applies_only_while_the_rejoiner_is_failed_and_ends_on_a_new_generation():
    store = _store()
    changed = threading.Event()
    faults = FaultPoints.of(store, (0, 1), [], [[4, 1, 1], [6, 2, 0]], 10.0, changed)
    assert faults.holds({(1, 1)}) == {4}
    assert faults.holds({(0, 0)}) == set()
    changed.set()
    assert faults.hold(4) is True  # interrupted: the rejoiner's generation is here
    assert faults.holds({(1, 1), (2, 0)}) == {6}  # 4 was held once already
    changed.clear()
    store.set(hold_release_key(6), "1")
    assert faults.hold(6) is False  # released by the launcher, no new generation
