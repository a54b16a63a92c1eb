"""Rollback snapshots in reused buffers (executor/snapshots.py): a restore returns exactly the
state taken, a released snapshot's buffers hold the next one, and nothing restored shares memory
with a buffer that a later snapshot overwrites."""

from __future__ import annotations

import torch
from torch import nn

from executor.app_stage import ReplicaState


def _replica() -> ReplicaState:
    torch.manual_seed(0)
    module = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3))
    return ReplicaState(module, torch.optim.AdamW(module.parameters(), lr=0.1))


def _step(replica: ReplicaState) -> None:
    for p in replica.module.parameters():
        p.grad = torch.randn_like(p)
    replica.optimizer.step()


def _state(replica: ReplicaState) -> dict[str, torch.Tensor]:
    """Every tensor of the replica's state, copied, by a name of its own."""
    out = {f"module.{k}": v.clone() for k, v in replica.module.state_dict().items()}
    for i, per_param in replica.optimizer.state_dict()["state"].items():
        out |= {f"opt.{i}.{k}": v.clone() for k, v in per_param.items() if torch.is_tensor(v)}
    return out


def _equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_restore_returns_the_state_taken_and_the_optimizer_keeps_none_of_the_buffers():
    replica = _replica()
    _step(replica)  # the optimizer has state (exp_avg, exp_avg_sq, step) from here on
    before = _state(replica)
    snap = replica.snapshot()
    _step(replica)
    _step(replica)
    assert not _equal(_state(replica), before)
    replica.restore(snap)
    assert _equal(_state(replica), before)
    # The snapshot is released and its buffers take the next one after two more steps: the state
    # restored before must not change with them (an optimizer may keep the tensors it is given).
    replica.release(snap)
    _step(replica)
    after_one = _state(replica)
    again = replica.snapshot()
    assert again.buffers is snap.buffers  # reused, not allocated afresh
    _step(replica)
    replica.restore(again)
    assert _equal(_state(replica), after_one)


def test_a_snapshot_before_the_first_step_restores_an_optimizer_without_state():
    replica = _replica()
    initial = _state(replica)
    snap = replica.snapshot()  # no optimizer state yet: another layout than after a step
    _step(replica)
    replica.restore(snap)
    assert _equal(_state(replica), initial)
    assert replica.optimizer.state_dict()["state"] == {}
    _step(replica)
    replica.release(snap)
    later = replica.snapshot()  # does not fit the released buffers: fresh ones
    assert later.buffers is not snap.buffers and len(later.buffers) > len(snap.buffers)
