#!/usr/bin/env bash
# The checks that need a GPU, as one prepared run on a lent one-GPU machine (its image has torch with
# CUDA; this project's other packages travel as wheels in .whl/, git-ignored; docs/benchmarks.md,
# "On a GPU", gives the command that downloads them for the machine's Python 3.12).
# Writes its results under $OUT (default out/gpu). Steps, each bounded:
#   1. the CUDA tests (CUDA-event op timing; the one-line refusal of cuda without a GPU per worker);
#   2. the B/W split against one full backward on the GPT example, at the CPU bar's size and at a
#      GPU-sized one (12 layers, width 1024, sequence 512);
#   3. a live one-worker CUDA run of the GPT example through the service and a worker daemon, with a
#      SIGKILL mid-iteration, a rejoin, a checkpoint restore and the loss comparison (NCCL refuses
#      two ranks on one GPU, so one worker is what one GPU can run);
#   4. the GPT example at the large size profiled on the GPU into a job spec, then planned;
#   5. rollback snapshots in pinned host memory against GPU memory and none: iteration time and
#      peak GPU memory (benchmarks/snapshot_gpu.py), at the large size.
# DEVICE=cpu SMALL=1 WHEELS=0 PY=.venv/bin/python dry-run the same steps on a machine without a GPU.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-out/gpu}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
if [ "${WHEELS:-1}" = 1 ] && compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site:$PWD
fi
export PYTHONUNBUFFERED=1 PYTHONPATH=${PYTHONPATH:-$PWD}
PY=${PY:-python3}
if [ "${SMALL:-0}" = 1 ]; then BIG=(4 64 32); else BIG=(12 1024 512); fi

step() { echo; echo "=== $*"; }
step facts
nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
$PY -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'gpus', torch.cuda.device_count(),
      torch.cuda.get_device_name() if torch.cuda.is_available() else '')" | tee "$OUT/facts.txt"

step "1. CUDA tests"
timeout 240 $PY -m pytest -q -rs -p no:cacheprovider tests/executor/test_gpu.py \
    tests/executor/test_train_cli.py::test_cuda_without_a_gpu_per_worker_is_one_clear_line 2>&1 | tail -15 | tee "$OUT/tests.txt"

step "2. B/W split vs one full backward ($DEVICE)"
RECYCLE_GPT_LAYERS=6 RECYCLE_GPT_WIDTH=256 RECYCLE_GPT_SEQ=128 timeout 150 \
    $PY benchmarks/bw_split_app.py --reps 15 --device "$DEVICE" | tee "$OUT/bw_split_small.json"
RECYCLE_GPT_LAYERS=${BIG[0]} RECYCLE_GPT_WIDTH=${BIG[1]} RECYCLE_GPT_SEQ=${BIG[2]} timeout 150 \
    $PY benchmarks/bw_split_app.py --reps 15 --device "$DEVICE" | tee "$OUT/bw_split_large.json"

step "3. live one-worker run: kill, rejoin, checkpoint restore, losses vs one process ($DEVICE)"
rm -rf /tmp/gpu-check-ckpt
timeout 240 $PY -m cli.main train --app examples.gpt:app -D 1 -S 1 -M 4 -N 8 --reps 3 \
    --kill 0:0@4:backward_input --rejoin 0:0@5 --checkpoint-dir /tmp/gpu-check-ckpt --checkpoint-every 2 \
    --stage-lost-wait 60 --check-exact --device "$DEVICE" --report "$OUT/train_one_worker.json" 2>&1 \
    | grep -v "it/s\]" | tail -25

step "4. profile the large GPT on $DEVICE, then plan 4 x 4 x 16 with two failures"
RECYCLE_GPT_LAYERS=${BIG[0]} RECYCLE_GPT_WIDTH=${BIG[1]} RECYCLE_GPT_SEQ=${BIG[2]} timeout 150 \
    $PY -m cli.main profile --app examples.gpt:app -D 4 -S 4 -M 16 --reps 10 --device "$DEVICE" \
    -o "$OUT/gpt_large_job.json" && cat "$OUT/gpt_large_job.json"
timeout 120 $PY -m cli.main plan "$OUT/gpt_large_job.json" --fail 0:1,3:2 --time-limit 10 --format summary \
    -o "$OUT/gpt_large_plan.json" 2>&1 | tail -12

step "5. rollback snapshots: host (pinned, side stream) vs device vs none ($DEVICE)"
RECYCLE_GPT_LAYERS=${BIG[0]} RECYCLE_GPT_WIDTH=${BIG[1]} RECYCLE_GPT_SEQ=${BIG[2]} timeout 150 \
    $PY benchmarks/snapshot_gpu.py --device "$DEVICE" --rounds ${SNAP_ROUNDS:-8} | tee "$OUT/snapshot_gpu.json"
echo; echo "gpu_check done"
