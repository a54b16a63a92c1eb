"""Fingerprints of the heuristic plans of every shared scenario, to show a refactor changed no plan.

Plans each job in `shared/scenarios/` with no failure and a fixed list of one- and two-worker
failure sets (corners, middle, same stage, same pipeline), heuristic only (`use_cp=False`, the
`--no-cp` path) and with no wall-time budget (a time limit of 1e6 s, so a loaded machine cannot cut
the candidate search short and change the winner). Each line is the SHA-256 of the timeline
document without its `solver` field (wall times), plus the winning policy's name.

    python benchmarks/plan_hashes.py > before.txt      # on the old code
    python benchmarks/plan_hashes.py --check before.txt # on the new: exit 1 on any difference
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SCENARIOS = REPO.parent / "shared" / "scenarios"


def failure_sets(pipelines: int, stages: int) -> list[list[tuple[int, int]]]:
    P, S = pipelines, stages
    return [
        [],
        [(0, 0)],
        [(P - 1, S - 1)],
        [(P // 2, S // 2)],
        [(0, 1 % S), (1, 1 % S)],  # one stage loses two workers
        [(0, 0), (0, S - 1)],  # one pipeline loses two workers
        [(1, 0), (P - 1, S // 2)],
    ]


def fingerprints() -> list[str]:
    sys.path.insert(0, str(REPO))
    from planner.solve import plan
    from planner.spec import JobSpec

    if not SCENARIOS.is_dir():
        raise SystemExit(f"missing {SCENARIOS} (the shared scenarios sit beside the repository)")
    lines = []
    for path in sorted(SCENARIOS.glob("*.json")):
        job = JobSpec.parse(json.loads(path.read_text()))
        for failed in failure_sets(job.pipelines, job.stages):
            result = plan(job, failed, time_limit_s=1e6, use_cp=False)
            doc = result.timeline_json()
            doc.pop("solver")
            digest = hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
            lines.append(f"{path.name} {failed} {digest[:16]} {result.iteration_ms:.6f} "
                         f"{result.stats.heuristic_policy}")
            print(lines[-1], flush=True)
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--check", type=Path, help="compare with a file written by an earlier run")
    args = parser.parse_args()
    lines = fingerprints()
    if args.check is None:
        return 0
    expected = args.check.read_text().splitlines()
    if expected == lines:
        print(f"identical: {len(lines)} plans", file=sys.stderr)
        return 0
    for old, new in zip(expected, lines, strict=False):
        if old != new:
            print(f"DIFFERS\n  before {old}\n  after  {new}", file=sys.stderr)
    if len(expected) != len(lines):
        print(f"DIFFERS: {len(expected)} plans before, {len(lines)} after", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
