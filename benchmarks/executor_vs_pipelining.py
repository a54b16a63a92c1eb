"""Fault-free iteration time: the executor vs `torch.distributed.pipelining` on the same model and
process layout (one pipeline of S stages, one process per stage, gloo on loopback, 1 torch thread
per process).

- executor: `train_local(1, S, M, N)` with the planner's fault-free plan (uniform-cost job), the
  B/W split and per-stage AdamW; median iteration time after 2 warm-up iterations.
- `Schedule1F1B`: `PipelineStage` per rank wrapping the same `StageModule` (no weight-gradient
  deferral: plain autograd), `schedule.step` + AdamW; same median.
- `ScheduleInterleavedZeroBubble` (with `--zero-bubble`, once): the model cut into 2 x S virtual
  stages, two per rank (its requirement), so the layout differs only in that split.

The executor and 1F1B run in `--rounds` alternating rounds (who goes first alternates too); the
report gives each round's ratio and the median, min and max of executor / 1F1B, so the machine
noise is visible next to the 1.05x bar. The 1F1B timing spans barrier to barrier around
`schedule.step` + AdamW (the batch is loaded before it); the executor's spans consecutive
iteration ends of the last worker (data loading included).

    python benchmarks/executor_vs_pipelining.py [--rounds 5 --stages 2 --microbatches 8
        --iterations 12 --layers 4 --width 128 --seq-len 64 --batch-size 4 --zero-bubble]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from executor_common import model_arguments, model_fields

from executor.data import DataConfig, builtin_app
from executor.local import train_local
from executor.model import ModelConfig, StageModule, loss
from executor.optim import OptimConfig
from executor.service import free_port

WARMUP = 2


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return loss(logits, targets)


def _rank(rank: int, world: int, port: int, schedule_name: str, cfg: dict, out: dict) -> None:
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleInterleavedZeroBubble

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=300))
    model = ModelConfig(**cfg["model"])
    data = DataConfig(batch_size=cfg["batch_size"])
    per_rank = 2 if schedule_name == "ScheduleInterleavedZeroBubble" else 1
    n_stages = world * per_rank
    # Interleaved placement: rank r holds virtual stages r and r + world.
    indices = [rank + k * world for k in range(per_rank)]
    M, B, T, W = cfg["microbatches"], cfg["batch_size"], model.seq_len, model.width
    stages, params = [], []
    for i in indices:
        piece = StageModule(model, n_stages, i)  # the last stage returns logits
        params += list(piece.parameters())
        example = (torch.zeros(B, T, dtype=torch.long) if i == 0 else torch.zeros(B, T, W))
        stages.append(PipelineStage(piece, i, n_stages, torch.device("cpu"), input_args=example))
    if per_rank == 1:
        schedule = Schedule1F1B(stages[0], M, loss_fn=loss_fn)
    else:
        schedule = ScheduleInterleavedZeroBubble(stages, M, loss_fn=loss_fn)
    opt = torch.optim.AdamW(params, lr=1e-3, foreach=False)
    app = builtin_app(model, data)
    times = []
    for it in range(cfg["iterations"]):
        x, y = (torch.cat(t) for t in zip(*(app.microbatch(it, j, M) for j in range(M)), strict=True))
        dist.barrier()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        has_first = 0 in indices
        has_last = n_stages - 1 in indices
        kwargs = {"target": y, "losses": []} if has_last else {}
        if has_first:
            schedule.step(x, **kwargs)
        else:
            schedule.step(**kwargs)
        opt.step()
        dist.barrier()
        times.append((time.perf_counter() - t0) * 1e3)
    if rank == 0:
        out["times"] = times
    dist.destroy_process_group()


def run_torch(schedule_name: str, stages: int, cfg: dict) -> list[float]:
    manager = mp.Manager()
    out = manager.dict()
    mp.spawn(_rank, args=(stages, free_port(), schedule_name, cfg, out), nprocs=stages, join=True)
    return list(out["times"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--rounds", type=int, default=5, help="alternating executor / 1F1B rounds")
    ap.add_argument("--zero-bubble", action="store_true", help="also run ScheduleInterleavedZeroBubble once")
    model_arguments(ap)
    args = ap.parse_args()
    if args.rounds < 1 or args.iterations <= WARMUP:
        raise SystemExit(f"--rounds must be >= 1 and --iterations > {WARMUP}")
    model = model_fields(args)
    cfg = {"model": model, "batch_size": args.batch_size, "microbatches": args.microbatches,
           "iterations": args.iterations}

    def executor_ms() -> float:
        ours = train_local(1, args.stages, args.microbatches, args.iterations, ModelConfig(**model),
                           DataConfig(batch_size=args.batch_size), OptimConfig(), timeout_s=600)
        return statistics.median(ours.iteration_ms[WARMUP:])

    def one_f_one_b_ms() -> float:
        return statistics.median(run_torch("Schedule1F1B", args.stages, cfg)[WARMUP:])

    # Machine load drifts over a run; alternating which side goes first in each round spreads
    # that drift over both, and the per-round ratios show how large the noise is.
    rounds = []
    for r in range(args.rounds):
        load = os.getloadavg()[0]
        if r % 2 == 0:
            ours, theirs = executor_ms(), one_f_one_b_ms()
        else:
            theirs, ours = one_f_one_b_ms(), executor_ms()
        rounds.append({"round": r, "first": "executor" if r % 2 == 0 else "Schedule1F1B",
                       "executor_ms": round(ours, 2), "1f1b_ms": round(theirs, 2),
                       "ratio": round(ours / theirs, 4), "load_before": round(load, 2),
                       "load_after": round(os.getloadavg()[0], 2)})
        print(json.dumps(rounds[-1]), flush=True)
    ratios = [row["ratio"] for row in rounds]
    report = {
        "cores": os.cpu_count(), "torch": torch.__version__, "config": vars(args), "rounds": rounds,
        "executor_over_1f1b": {"median": round(statistics.median(ratios), 4), "min": min(ratios),
                               "max": max(ratios)},
        "median_iteration_ms": {"executor": round(statistics.median(r["executor_ms"] for r in rounds), 2),
                                "Schedule1F1B": round(statistics.median(r["1f1b_ms"] for r in rounds), 2)},
    }
    if args.zero_bubble:
        zb = statistics.median(run_torch("ScheduleInterleavedZeroBubble", args.stages, cfg)[WARMUP:])
        report["median_iteration_ms"]["ScheduleInterleavedZeroBubble"] = round(zb, 2)
        report["executor_over_interleaved_zb"] = round(report["median_iteration_ms"]["executor"] / zb, 4)
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
