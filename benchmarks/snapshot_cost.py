"""Cost of a rollback snapshot: deep copies of the state dicts (the old way) against copies into
reused buffers (`executor.snapshots.SnapshotPool`, what workers do), alternated round by round.

One stage of the GPT example (all of it: `-S 1`) with AdamW after one step, so the optimizer has its
moments; one thread; wall time; medians over the rounds and their ratio.

    RECYCLE_GPT_LAYERS=6 RECYCLE_GPT_WIDTH=256 RECYCLE_GPT_SEQ=128 python benchmarks/snapshot_cost.py
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from executor.app import build_stage, load_app  # noqa: E402
from executor.app_stage import ReplicaState  # noqa: E402
from executor.runtime import SNAPSHOTS_KEPT  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", default="examples.gpt:app")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    app = load_app(args.app)
    module = build_stage(app, 0, 1).to(device)
    optimizer = app.optimizer(module.parameters())
    for p in module.parameters():
        p.grad = torch.randn_like(p)
    optimizer.step()
    replica = ReplicaState(module, optimizer)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def deep() -> None:
        copy.deepcopy(module.state_dict()), copy.deepcopy(optimizer.state_dict())

    kept: list = []

    def pooled() -> None:
        # As a worker's step does: with SNAPSHOTS_KEPT held, the oldest is released first and its
        # buffers take the new one.
        if len(kept) == SNAPSHOTS_KEPT:
            replica.release(kept.pop(0))
        kept.append(replica.snapshot())

    times: dict[str, list[float]] = {"deepcopy": [], "pool": []}
    for i in range(args.rounds + 3):
        order = (("deepcopy", deep), ("pool", pooled))
        for name, fn in order if i % 2 else order[::-1]:
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            if i >= 3:
                times[name].append(time.perf_counter() - t0)
    med = {k: statistics.median(v) * 1e3 for k, v in times.items()}
    state_mb = sum(t.numel() * t.element_size() for t in replica.snapshot().buffers) / 2**20
    print(json.dumps({"app": args.app, "device": args.device, "state_mb": round(state_mb, 1),
                      "deepcopy_ms": round(med["deepcopy"], 3), "pool_ms": round(med["pool"], 3),
                      "pool_over_deepcopy": round(med["pool"] / med["deepcopy"], 3)}))


if __name__ == "__main__":
    main()
