"""Measured iteration time of the executor against the planner's prediction from a profiled spec.

Profiles the model on this machine (one torch thread, as each worker runs), plans the job with and
without a failure from that profile, trains each case with real worker processes, and compares
the measured steady-state iteration time (median over iterations after the first two) with the
plan's `iteration_ms`. On a machine with fewer cores than D x S workers the processes share cores,
which the prediction (one device per worker) does not model; the script prints the core count.

So it also re-profiles in situ: from the fault-free run's own per-instruction seconds (F, B, W and
optimizer per micro-batch, measured inside the worker processes while they shared the cores), it
builds a second job spec (p2p from the isolated profile; all-reduce from the replica that waited
least) and predicts the failure case from that; both predictions are reported.

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
from planner.solve import plan
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
    in_situ = None
    for failed in ((), (tuple(int(v) for v in args.fail.split(":")),)):
        run = train_local(args.pipelines, args.stages, args.microbatches, args.iterations, model, data,
                          failed=failed, job=job, timeout_s=600)
        measured = statistics.median(run.iteration_ms[2:])
        row = {"failed": [list(w) for w in failed], "predicted_ms": round(run.predicted_ms, 3),
               "measured_ms": round(measured, 3),
               "measured_over_predicted": round(measured / run.predicted_ms, 4)}
        if in_situ is None:
            in_situ = in_situ_spec(spec, run.op_seconds, args)
        else:
            predicted = plan(JobSpec.parse(in_situ), failed=failed, use_cp=False).iteration_ms
            row["in_situ_predicted_ms"] = round(predicted, 3)
            row["measured_over_in_situ"] = round(measured / predicted, 4)
        rows.append(row)
    report = {"cores": os.cpu_count(), "config": vars(args), "profile": spec, "in_situ_profile": in_situ,
              "cases": rows}
    print(json.dumps(report, indent=2))


def in_situ_spec(spec: dict, op_seconds: dict[str, dict[str, float]], args) -> dict:
    """The job spec re-measured inside the fault-free run (ms per micro-batch / per iteration)."""
    per_mb = args.iterations * args.microbatches
    out = dict(spec)
    figures = (("forward_ms", "F", per_mb), ("backward_input_ms", "B", per_mb),
               ("backward_weight_ms", "W", per_mb), ("optimizer_ms", "OPTIMIZER", args.iterations))
    for field, op, count in figures:
        out[field] = [round(1e3 * statistics.mean(v[op] for k, v in op_seconds.items()
                                                  if int(k.split(":")[1]) == s) / count, 4)
                      for s in range(args.stages)]
    if args.pipelines > 1:
        out["allreduce_ms"] = [round(1e3 * min(v["ALLREDUCE"] for k, v in op_seconds.items()
                                               if int(k.split(":")[1]) == s) / args.iterations, 4)
                               for s in range(args.stages)]
    return out


if __name__ == "__main__":
    main()
