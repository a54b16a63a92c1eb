"""A large job's first failure plan through a real `recycle serve`: created, then planned at once.

Usage:
    python benchmarks/api_first_plan.py [--pipelines 8] [--stages 32] [--microbatches 256]

The job has uneven stages and a memory limit (`fault_free_wall.large_pipeline`'s costs, D pipelines),
so its fault-free plan takes tens of seconds. The service makes that plan once per job (the warm-up
at creation, and before the first solve under RECYCLE_FAULT_FREE_DEADLINE_S), and the solve's own
deadline (2 x the limit + 30 s) counts the solve alone. Prints the plan's status (done, or failed
with the service's reason), its period and the seconds from job creation to the answer.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from api_common import start_service, stop_service  # noqa: E402
from fault_free_wall import large_pipeline  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pipelines", type=int, default=8)
    parser.add_argument("--stages", type=int, default=32)
    parser.add_argument("--microbatches", type=int, default=256)
    parser.add_argument("--memory-mb", type=float, default=20.0)
    parser.add_argument("--timeout", type=float, default=600.0, help="give up after this many seconds")
    args = parser.parse_args()
    spec = large_pipeline(3, args.stages, args.microbatches, args.memory_mb).model_dump(exclude_none=True)
    spec["pipelines"] = args.pipelines
    os.environ.pop("RECYCLE_FAULT_FREE_CACHE", None)  # the service's own temporary directory
    process, url, folder = start_service()
    try:
        client = httpx.Client(base_url=url, timeout=60)
        started = time.monotonic()
        created = client.post("/v1/jobs", json=spec)
        created.raise_for_status()
        job_id = created.json()["id"]
        failed = [[0, args.stages // 6]]
        answer = client.post(f"/v1/jobs/{job_id}/plans", json={"failed": failed, "wait_s": 30})
        location = answer.headers.get("Location")
        while answer.json().get("status") == "pending" and time.monotonic() - started < args.timeout:
            time.sleep(1.0)
            answer = client.get(location)
        body = answer.json()
        print(f"{args.pipelines}x{args.stages}x{args.microbatches}: {body.get('status')} after "
              f"{time.monotonic() - started:.1f} s from job creation, period {body.get('iteration_ms')} ms, "
              f"error {body.get('error')}")
        return 0 if body.get("status") == "done" else 1
    finally:
        stop_service(process)
        folder.cleanup()


if __name__ == "__main__":
    sys.exit(main())
