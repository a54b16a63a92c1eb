#!/usr/bin/env bash
# Set up, then run the end-to-end demo: the plan service (embedded SQLite), the GPT example
# (examples/gpt.py, plain torch.nn, byte-level text) profiled into a job, its precomputed plans,
# 3 x 2 CPU worker processes training 8 iterations, worker 1:1 SIGKILLed in the middle of
# iteration 3 (the survivors roll the iteration back and rerun it under the re-routed plan),
# restarted to rejoin at iteration 6, the summary table, and a comparison of every loss with the
# same training run without failures (also in $TMPDIR/recycle-demo-report.json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
recycle train --app examples.gpt:app --pipelines 3 --stages 2 --microbatches 4 --iterations 8 \
  --kill 1:1@3:forward --rejoin 1:1@6 --check-exact --report "${TMPDIR:-/tmp}/recycle-demo-report.json"
