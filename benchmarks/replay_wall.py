"""How long one replay takes, on graphs of different widths (the simulator walks narrow graphs in
plain Python and wide ones level by level with numpy; `planner.simulator.NUMPY_LEVELS_MIN_CHAINS`).

Usage:
    python benchmarks/replay_wall.py [--repeats 21]

Each case replays one list schedule (the list scheduler's default policy) `--repeats` times and
prints the median wall time of a whole `replay` call (graph build plus the iterations until it
settles) and of the graph build alone, with the graph's size. Run it from a checkout of each
commit to compare; the machine is shared, so compare runs made one after the other.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from fault_free_wall import large_pipeline  # noqa: E402
from gap_unseen import scenario_job  # noqa: E402

from planner import simulator  # noqa: E402
from planner.heuristic import Policy, list_schedule  # noqa: E402
from planner.routing import balanced_routing  # noqa: E402
from planner.spec import JobSpec  # noqa: E402


def cases() -> list[tuple[str, JobSpec, tuple]]:
    gpt = scenario_job("gpt-1.5b-8x8x24")
    wide = JobSpec.parse({**gpt.model_dump(exclude_none=True), "pipelines": 32})
    return [
        ("1x16x128 (one pipeline, memory 12 MB)", large_pipeline(3, 16, 128, 12.0), ()),
        ("1x32x128 (one pipeline, memory 30 MB)", large_pipeline(5, 32, 128, 30.0), ()),
        ("gpt-1.5b 8x8x24, (3,5) (7,2) dead", gpt, ((3, 5), (7, 2))),
        ("gpt-1.5b 32x8x24, (3,5) (7,2) dead", wide, ((3, 5), (7, 2))),
    ]


def median_ms(call, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return statistics.median(times) * 1e3


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=21)
    args = parser.parse_args()
    for name, job, failed in cases():
        ops = list_schedule(job, balanced_routing(job, failed), Policy())
        report = simulator.replay(job, ops)
        graph = simulator._build_graph(job, ops)
        replay_ms = median_ms(lambda: simulator.replay(job, ops), args.repeats)  # noqa: B023
        build_ms = median_ms(lambda: simulator._build_graph(job, ops), args.repeats)  # noqa: B023
        print(f"{name}: {len(ops)} ops, {len(graph.workers)} workers; replay {replay_ms:.2f} ms "
              f"({report.iterations} iterations), graph build {build_ms:.2f} ms; "
              f"period {report.iteration_ms:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
