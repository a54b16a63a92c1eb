"""Measured iteration time of the executor against the planner's prediction (bar: within 15%).

The planner predicts one device per worker. On a CPU box a "device" is a core, so a fair check
needs (a) no more alive worker processes than free cores and (b) op times measured the way the
run will see them. For every case (a layout D x S plus an optional failed worker) this script:

1. profiles in the same layout: one profiler process per alive worker of the case, all started
   together and running their own stage's F / B / W / AdamW step concurrently (1 torch thread each,
   like the workers), and the stage gradient all-reduce over that stage's alive profiler processes
   (real gloo between processes, so a failure case's all-reduce has the failure case's rank count);
   per-stage figures are the medians over the stage's processes;
2. plans the case from that spec (`planner.solve.plan`, heuristic) -> predicted `iteration_ms`;
3. trains the case with real worker processes (`train_local`, the failed worker never started)
   and takes the median iteration after the first two -> measured;
4. prints measured / predicted, plus the prediction from the old isolated profile (one process)
   for comparison, the core count and the load average before and after.

    python benchmarks/executor_iteration.py [--case 2x1 --case 3x1:2:0 ...] [--iterations 12
        --microbatches 4 --layers 4 --width 128 --seq-len 64 --batch-size 4 --reps 20]

A case is DxS or DxS:P:S (P:S = the failed worker). Defaults: 2x1 fault-free and 3x1 with worker
2:0 failed (2 alive processes, each running 1.5 M micro-batches), both fitting 2 cores.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
from executor_common import model_arguments, model_fields

from executor.data import DataConfig
from executor.local import train_local
from executor.model import ModelConfig, StageModule
from executor.profile import WARMUP, p2p_ms, profile_job, profile_stage
from planner.solve import plan
from planner.spec import JobSpec

STORE_TIMEOUT_S = 120


def parse_case(text: str) -> tuple[int, int, tuple[tuple[int, int], ...]]:
    try:
        layout, *fail = text.split(":")
        d, s = (int(v) for v in layout.lower().split("x"))
        failed = ((int(fail[0]), int(fail[1])),) if fail else ()
        if len(fail) not in (0, 2) or d < 1 or s < 1:
            raise ValueError
    except ValueError:
        raise SystemExit(f"--case {text!r}: expected DxS or DxS:P:S, e.g. 3x1:2:0") from None
    return d, s, failed


def profile_worker(args) -> None:
    """One profiler process: its stage's compute, then the stage all-reduce with its stage peers."""
    torch.set_num_threads(1)
    model = ModelConfig(**json.loads(args.model_json))
    stage, rank, size = args.profile_stage, args.profile_rank, args.profile_size
    store = dist.TCPStore("127.0.0.1", args.profile_port, is_master=False,
                          timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
    # Start together, so every figure is measured while all the case's processes compute.
    store.add("ready", 1)
    store.wait(["go"])
    row = profile_stage(model, DataConfig(batch_size=args.batch_size), stage, args.stages, args.reps,
                        torch.device("cpu"))
    module = StageModule(model, args.stages, stage)
    row["allreduce"] = 0.0
    if size > 1:
        pg = dist.ProcessGroupGloo(dist.PrefixStore(f"stage{stage}", store), rank, size,
                                   datetime.timedelta(seconds=STORE_TIMEOUT_S))
        buf = torch.ones(sum(p.numel() for p in module.parameters()))
        times = []
        for _ in range(args.reps + WARMUP):
            t0 = time.perf_counter()
            pg.allreduce([buf]).wait()
            times.append(time.perf_counter() - t0)
        row["allreduce"] = statistics.median(times[WARMUP:]) * 1e3
    Path(args.profile_out).write_text(json.dumps(row))
    store.add("done", 1)
    store.wait(["all-done"])  # keep the group alive until every peer has its all-reduce figures


def profile_in_layout(args, model: ModelConfig, pipelines: int, stages: int,
                      failed: tuple[tuple[int, int], ...]) -> dict:
    """A job spec whose op times were measured by one concurrent process per alive worker."""
    alive = [(p, s) for p in range(pipelines) for s in range(stages) if (p, s) not in failed]
    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=STORE_TIMEOUT_S))
    rows: dict[int, list[dict]] = {s: [] for s in range(stages)}
    with tempfile.TemporaryDirectory(prefix="recycle-profile-") as tmp:
        procs = []
        for p, s in alive:
            peers = [w for w in alive if w[1] == s]
            out = Path(tmp) / f"{p}-{s}.json"
            cmd = [sys.executable, __file__, "--profile-stage", str(s),
                   "--profile-rank", str(peers.index((p, s))), "--profile-size", str(len(peers)),
                   "--profile-port", str(store.port),
                   "--profile-out", str(out), "--model-json", json.dumps(model.to_json()),
                   "--stages", str(stages), "--batch-size", str(args.batch_size), "--reps", str(args.reps)]
            procs.append((subprocess.Popen(cmd), s, out))
        try:
            _wait_count(store, "ready", len(alive))
            store.set("go", "1")
            _wait_count(store, "done", len(alive))
            store.set("all-done", "1")
            for proc, s, out in procs:
                if proc.wait(STORE_TIMEOUT_S) != 0:
                    raise SystemExit(f"profiler for stage {s} exited with code {proc.returncode}")
                rows[s].append(json.loads(out.read_text()))
        finally:
            for proc, _, _ in procs:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait(5)

    def per_stage(key: str) -> list[float]:
        return [round(max(statistics.median(r[key] for r in rows[s]), 1e-4), 4) for s in range(stages)]

    hop = round(p2p_ms(args.batch_size * model.seq_len * model.width, args.reps), 4)
    spec = {"pipelines": pipelines, "stages": stages, "microbatches": args.microbatches,
            "forward_ms": per_stage("F"), "backward_input_ms": per_stage("B"),
            "backward_weight_ms": per_stage("W"), "p2p_ms": hop, "cross_pipeline_p2p_ms": hop,
            "allreduce_ms": [round(statistics.median(r["allreduce"] for r in rows[s]), 4)
                             for s in range(stages)],
            "optimizer_ms": per_stage("optimizer"), "activation_mb": per_stage("activation_mb"),
            "memory_limit_mb": None}
    JobSpec.parse(spec)
    return spec


def _wait_count(store: dist.TCPStore, key: str, count: int) -> None:
    deadline = time.monotonic() + STORE_TIMEOUT_S
    while store.add(key, 0) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"profiler processes: only {store.add(key, 0)} of {count} reached '{key}'")
        time.sleep(0.02)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", action="append", help="DxS or DxS:P:S (repeatable)")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=12)
    model_arguments(ap)
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--stages", type=int, default=1, help=argparse.SUPPRESS)
    for internal in ("--profile-stage", "--profile-rank", "--profile-size", "--profile-port"):
        ap.add_argument(internal, type=int, help=argparse.SUPPRESS)
    ap.add_argument("--profile-out", help=argparse.SUPPRESS)
    ap.add_argument("--model-json", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.profile_out:
        profile_worker(args)
        return
    torch.set_num_threads(1)
    model = ModelConfig(**model_fields(args))
    data = DataConfig(batch_size=args.batch_size)
    rows = []
    for text in args.case or ["2x1", "3x1:2:0"]:
        pipelines, stages, failed = parse_case(text)
        load_before = os.getloadavg()[0]
        isolated = JobSpec.parse(profile_job(model, pipelines, stages, args.microbatches, data, args.reps))
        spec = profile_in_layout(args, model, pipelines, stages, failed)
        predicted = plan(JobSpec.parse(spec), failed=failed, use_cp=False).iteration_ms
        run = train_local(pipelines, stages, args.microbatches, args.iterations, model, data,
                          failed=failed, job=JobSpec.parse(spec), timeout_s=600)
        measured = statistics.median(run.iteration_ms[2:])
        isolated_ms = plan(isolated, failed=failed, use_cp=False).iteration_ms
        rows.append({
            "case": text, "alive_processes": pipelines * stages - len(failed),
            "predicted_ms": round(predicted, 2), "measured_ms": round(measured, 2),
            "measured_over_predicted": round(measured / predicted, 3),
            "isolated_profile_predicted_ms": round(isolated_ms, 2),
            "measured_over_isolated": round(measured / isolated_ms, 3),
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
            "in_layout_profile": spec,
        })
        print(json.dumps({k: v for k, v in rows[-1].items() if k != "in_layout_profile"}), flush=True)
    print(json.dumps({"cores": os.cpu_count(), "config": {k: v for k, v in vars(args).items()
                                                          if not k.startswith(("profile", "model_json"))},
                      "cases": rows}, indent=2))


if __name__ == "__main__":
    main()
