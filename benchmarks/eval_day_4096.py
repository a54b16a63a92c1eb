"""Bar: a 4,096-GPU simulated day under a Poisson trace finishes in under 10 minutes.

Runs `recycle bench --suite day-4096` (128 x 32 x 96 GPT-3-like job, 24 h, MTBF from Llama 3 unless
--mtbf-hours is given) as a subprocess, prints the wall time and the plan lookups, and exits 1 when
the run takes 600 s or more. Usage: python benchmarks/eval_day_4096.py [--mtbf-hours H] [-o DIR]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LIMIT_S = 600.0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mtbf-hours", type=float)
    parser.add_argument("-o", "--output", help="keep the outputs here (default: a temporary folder)")
    args = parser.parse_args()
    out = Path(args.output or tempfile.mkdtemp(prefix="eval-day-4096-"))
    cmd = [sys.executable, "-m", "cli.main", "bench", "--suite", "day-4096", "-o", str(out)]
    if args.mtbf_hours:
        cmd += ["--mtbf-hours", str(args.mtbf_hours)]
    started = time.perf_counter()
    done = subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], timeout=2 * LIMIT_S)
    wall = time.perf_counter() - started
    if done.returncode != 0:
        print(f"bench failed with exit code {done.returncode}")
        return 1
    day = json.loads((out / "day.json").read_text())
    print(f"4,096-GPU day: {day['failures']} failures, {day['events']} events, lookups {day['lookups']}, "
          f"day simulation {day['wall_s']} s, whole command {wall:.1f} s (limit {LIMIT_S:.0f} s); "
          f"outputs in {out}")
    return 0 if wall < LIMIT_S else 1


if __name__ == "__main__":
    sys.exit(main())
