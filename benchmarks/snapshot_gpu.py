"""Rollback snapshots on a GPU: where they live and what they cost a training iteration.

One stage holding the whole training app (default the GPT example, `-S 1`) with its optimizer on
one GPU, trained as a worker does: `--microbatches` forwards and backwards, then the optimizer step,
every iteration. Three ways, alternated iteration by iteration so clock drift and GPU warmth favour
none:
- `none`: no snapshots (a job that never rolls back);
- `device`: two snapshot sets in GPU memory, each copied on the compute stream when the replica
  reaches the state (`--snapshot-memory device`);
- `host`: two sets in pinned host memory, copied on a side stream while the next iteration computes;
  the step waits for the copy on the device only (`--snapshot-memory host`, the default).
Each way runs blocks of `--block` consecutive iterations, the ways' blocks alternated, each timed
from a device-wide synchronize to the end of the compute stream's work (as a worker stamps an
iteration's end), so a step waits for the copy queued one iteration before, and the block's last
copy is drained untimed; per-iteration medians, and each way's over `none`'s. GPU memory held
between iterations per way: `memory_allocated` before building it and after its warm-up (the
parameters, the optimizer's state and, for `device`, the snapshots).

    RECYCLE_GPT_LAYERS=12 RECYCLE_GPT_WIDTH=1024 RECYCLE_GPT_SEQ=512 python benchmarks/snapshot_gpu.py
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from executor.app import build_stage, load_app  # noqa: E402
from executor.app_stage import ReplicaState, to_device  # noqa: E402
from executor.runtime import SNAPSHOTS_KEPT  # noqa: E402

WAYS = ("none", "device", "host")


class Trainer:
    """One way's replica and its snapshots, kept as `Worker._keep_snapshot` keeps them."""

    def __init__(self, app, way: str, device: torch.device, batches: list):
        torch.manual_seed(0)
        self.app, self.way, self.batches = app, way, batches
        self.module = build_stage(app, 0, 1).to(device)
        self.optimizer = app.optimizer(self.module.parameters())
        self.replica = ReplicaState(self.module, self.optimizer, host_memory=way == "host")
        self.kept: list = []

    def _keep(self) -> None:
        if self.way == "none":
            return
        if len(self.kept) == SNAPSHOTS_KEPT:
            self.replica.release(self.kept.pop(0))
        self.kept.append(self.replica.snapshot())

    def iteration(self) -> None:
        for x, target in self.batches:
            loss = self.app.loss(self.module(x), target) / len(self.batches)
            loss.backward()
        self.replica.before_step()
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self._keep()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", default="examples.gpt:app")
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=8, help="timed blocks per way")
    ap.add_argument("--block", type=int, default=5, help="consecutive iterations per timed block")
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args()
    device = torch.device(args.device)
    cuda = device.type == "cuda"
    if cuda and not torch.cuda.is_available():
        sys.exit("snapshot_gpu.py: no CUDA device here (--device cpu dry-runs the same steps)")
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    # A worker stamps an iteration's end after its own stream's last kernel (`OpTimer.flush`), not
    # after every stream: the snapshot copy queued after the step runs on into the next iteration.
    stream_done = (lambda: torch.cuda.current_stream(device).synchronize()) if cuda else (lambda: None)
    allocated = (lambda: torch.cuda.memory_allocated(device) / 2**20) if cuda else (lambda: 0.0)
    app = load_app(args.app)
    batches = [tuple(to_device(t, device) for t in app.microbatch(0, 0, i)) for i in range(args.microbatches)]
    trainers, held_mb = {}, {}
    for way in WAYS:  # one at a time, so that each one's memory between iterations is its own
        sync()
        before = allocated()
        trainers[way] = Trainer(app, way, device, batches)
        for _ in range(SNAPSHOTS_KEPT + 1):  # the optimizer's state exists, every buffer is allocated
            trainers[way].iteration()
        sync()
        held_mb[way] = allocated() - before
    times: dict[str, list[float]] = {way: [] for way in WAYS}
    for i in range(args.rounds):
        for way in WAYS if i % 2 else WAYS[::-1]:
            # A block of consecutive iterations: each step waits for the copy the one before it
            # queued, as in a worker; the last copy is drained after the clock stops.
            sync()
            t0 = time.perf_counter()
            for _ in range(args.block):
                trainers[way].iteration()
            stream_done()
            times[way].append((time.perf_counter() - t0) * 1e3 / args.block)
            sync()
    params = sum(p.numel() for p in trainers["none"].module.parameters())
    state_mb = sum(b.numel() * b.element_size() for b in trainers["host"].kept[-1].buffers) / 2**20
    med = {way: statistics.median(v) for way, v in times.items()}
    # The host way's copy is still running when the next step is queued: restoring it must give
    # back exactly the state it was taken from.
    host = trainers["host"]
    sync()
    taken = {k: v.clone() for k, v in host.module.state_dict().items()}
    snap = host.replica.snapshot()
    host.iteration()
    host.replica.restore(snap)
    restored_exact = all(torch.equal(host.module.state_dict()[k], v) for k, v in taken.items())
    pinned_mb = sum(b.numel() * b.element_size() for b in snap.buffers if b.is_pinned()) / 2**20
    print(json.dumps({
        "device": torch.cuda.get_device_name(device) if cuda else "cpu", "torch": torch.__version__,
        "app": args.app,
        "parameters_m": round(params / 1e6, 1), "snapshot_set_mb": round(state_mb, 1),
        "microbatches": args.microbatches, "rounds": args.rounds, "block": args.block,
        "iteration_ms": {w: round(m, 2) for w, m in med.items()},
        "over_none": {w: round(m / med["none"], 4) for w, m in med.items()},
        "gpu_mb_held_between_iterations": {w: round(m, 1) for w, m in held_mb.items()},
        "host_pinned_mb": round(pinned_mb, 1), "restored_exact": restored_exact,
    }, indent=1))


if __name__ == "__main__":
    main()
