"""Recovery time of a live run: SIGKILL a worker in each phase of an iteration, on loopback.

Recovery = kill to the first iteration completed under the new plan, minus one normal iteration
(the median iteration of the fault-free generation); detection = kill to the first survivor
running the next generation. Bar: recovery under 3 s. Runs against a `recycle serve` subprocess
(SQLite in a temp dir, heartbeat 0.25 s / timeout 1.5 s) with real worker processes.

    python benchmarks/executor_recovery.py [--pipelines 3 --stages 2 --iterations 8 --kill 1:1@3
        --trials 1 --no-agent-reports]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path

from executor.cluster import Fault, LiveCluster
from executor.fault_points import PHASES
from executor.local import uniform_job
from executor.model import ModelConfig
from executor.service import LocalService, ServiceClient


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipelines", type=int, default=3)
    ap.add_argument("--stages", type=int, default=2)
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--iterations", type=int, default=8)
    ap.add_argument("--kill", default="1:1@3", help="P:S@ITER; every phase is tried")
    ap.add_argument("--trials", type=int, default=1)
    ap.add_argument("--no-agent-reports", action="store_true",
                    help="the launcher does not report the kill: survivors and heartbeats must detect it")
    args = ap.parse_args()
    head, _, it = args.kill.partition("@")
    worker = tuple(int(v) for v in head.split(":"))
    model = ModelConfig(layers=2 * args.stages, width=32, heads=2, vocab=64, seq_len=16, seed=1)
    rows = []
    spec = uniform_job(args.pipelines, args.stages, args.microbatches).filled()
    with tempfile.TemporaryDirectory() as tmp, LocalService(Path(tmp), {"RECYCLE_USE_CP": "false"}) as svc:
        client = ServiceClient(svc.url)
        for phase in PHASES:
            for _ in range(args.trials):
                job = client.create_job(spec)
                client.precompute(job, 1, 60)
                started = time.time()
                run = LiveCluster(svc.url, job, args.pipelines, args.stages, args.microbatches,
                                  args.iterations, model, faults=[Fault(worker, int(it), phase)],
                                  agent_reports=not args.no_agent_reports, timeout_s=300).run()
                (f,) = run.failures
                normal = sorted(r["iteration_ms"] for r in run.iterations)[len(run.iterations) // 2]
                rows.append({"phase": phase, "recovery_ms": f["recovery_ms"], "detected_ms": f["detected_ms"],
                             "normal_iteration_ms": normal, "wall_s": round(time.time() - started, 1)})
                print(json.dumps(rows[-1]), flush=True)
    worst = max(r["recovery_ms"] for r in rows)
    print(json.dumps({"cores": os.cpu_count(), "config": vars(args), "worst_recovery_ms": worst,
                      "bar_ms": 3000, "meets_bar": worst < 3000, "cases": rows}, indent=2))


if __name__ == "__main__":
    main()
