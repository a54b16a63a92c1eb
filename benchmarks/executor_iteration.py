"""Measured iteration time of the executor against the planner's prediction from a profiled spec.

Profiles the model on this machine (one torch thread, as each worker runs), plans the job with and
without a failure from that profile, trains each case with real worker processes, and compares
the measured steady-state iteration time (median over iterations after the first two) with the
plan's `iteration_ms`. On a machine with fewer cores than D x S workers the processes share cores,
which the prediction (one device per worker) does not model; the script prints the core count.

    python benchmarks/executor_iteration.py [--pipelines 2 --stages 2 --microbatches 4 --iterations 12
        --fail 1:1 --layers 4 --width 128 --seq-len 64 --batch-size 4]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics

import torch

from executor.data import DataConfig
from executor.local import train_local
from executor.model import ModelConfig
from executor.profile import profile_job
from planner.spec import JobSpec


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipelines", type=int, default=2)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=12)
    ap.add_argument("--fail", default="1:1", help="P:S of the failed worker in the failure case")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--width", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=256)
    ap.add_argument("--seq-len", type=int, default=64)
    ap.add_argument("--batch-size", type=int, default=4)
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args()
    torch.set_num_threads(1)
    model = ModelConfig(layers=args.layers, width=args.width, heads=args.heads, vocab=args.vocab,
                        seq_len=args.seq_len)
    data = DataConfig(batch_size=args.batch_size)
    spec = profile_job(model, args.pipelines, args.stages, args.microbatches, data, args.reps)
    job = JobSpec.parse(spec)
    rows = []
    for failed in ((), (tuple(int(v) for v in args.fail.split(":")),)):
        run = train_local(args.pipelines, args.stages, args.microbatches, args.iterations, model, data,
                          failed=failed, job=job, timeout_s=600)
        measured = statistics.median(run.iteration_ms[2:])
        rows.append({"failed": [list(w) for w in failed], "predicted_ms": round(run.predicted_ms, 3),
                     "measured_ms": round(measured, 3), "measured_over_predicted":
                     round(measured / run.predicted_ms, 4)})
    report = {"cores": os.cpu_count(), "config": vars(args), "profile": spec, "cases": rows}
    print(json.dumps(report, indent=2))


if __name__ == "__main__":
    main()
