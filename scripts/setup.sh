#!/usr/bin/env bash
# Create .venv (if needed) and install recycle with every extra, pinned. Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PY" -m venv .venv
fi
. .venv/bin/activate
python -m pip install --quiet --upgrade pip
# torch first and exactly pinned: the machine has a local CPU wheel for 2.13.0; any other version
# would pull gigabytes of CUDA packages.
python -m pip install --quiet "torch==2.13.0"
python -m pip install --quiet -e ".[api,executor,dev]"
python -c "import torch; assert torch.__version__.startswith('2.13.0'), torch.__version__"
