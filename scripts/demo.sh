#!/usr/bin/env bash
# Set up, then run the end-to-end demo.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
. .venv/bin/activate
recycle plan ../shared/scenarios/gpt-1.5b-8x8x24.json --fail 1:3 --time-limit 10
