#!/usr/bin/env bash
# Set up, then run the end-to-end demo: the plan service (embedded SQLite), a profiled job, its
# precomputed plans, 3 x 2 CPU worker processes training 8 iterations, worker 1:1 SIGKILLed in the
# middle of iteration 3 (the survivors roll the iteration back and rerun it under the re-routed plan),
# restarted to rejoin at iteration 6, and the summary table (also written to $TMPDIR/recycle-demo-report.json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
recycle train --pipelines 3 --stages 2 --microbatches 4 --iterations 8 \
  --kill 1:1@3:forward --rejoin 1:1@6 --report "${TMPDIR:-/tmp}/recycle-demo-report.json"
