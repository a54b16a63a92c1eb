"""Benchmark: a stored plan's worker instruction streams under 64 concurrent clients.

Starts `recycle serve` (SQLite), registers the 8 x 8 x 24 GPT-1.5B job, stores the plan of one
failure, then 64 keep-alive clients fetch random alive workers' streams for --seconds. Reports
latency percentiles and throughput. Bar: p99 < 20 ms on the 2-core machine.

    python benchmarks/api_instructions.py [--clients 64] [--seconds 10] [--access-log]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import httpx
from api_common import Connection, host_port, percentile, run_loop, scenario, start_service, stop_service


async def load(url: str, job_id: str, plan_id: str, workers: list, clients: int, seconds: float) -> list:
    host, port = host_port(url)
    latencies: list[float] = []
    errors = 0
    stop_at = time.perf_counter() + seconds

    async def client(seed: int) -> None:
        nonlocal errors
        rng = random.Random(seed)
        conn = await Connection(host, port).open()
        try:
            while time.perf_counter() < stop_at:
                p, s = rng.choice(workers)
                started = time.perf_counter()
                status, body = await conn.request("GET", f"/v1/jobs/{job_id}/plans/{plan_id}/workers/{p}/{s}")
                latencies.append(time.perf_counter() - started)
                if status != 200 or not body:
                    errors += 1
        finally:
            await conn.close()

    await asyncio.gather(*(client(i) for i in range(clients)))
    return latencies, errors


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--access-log", action="store_true", help="keep the per-request log line on")
    args = ap.parse_args()
    proc, url, _tmp = start_service(RECYCLE_ACCESS_LOG=str(args.access_log).lower())
    try:
        with httpx.Client(base_url=url, timeout=120) as c:
            job_id = c.post("/v1/jobs", json=scenario("gpt-1.5b-8x8x24.json")).json()["id"]
            plan = c.post(f"/v1/jobs/{job_id}/plans", json={"failed": [[0, 3]], "wait_s": 120}).json()
            assert plan["status"] == "done", plan
            workers = [(p, s) for p in range(8) for s in range(8) if (p, s) != (0, 3)]
            size = len(c.get(f"/v1/jobs/{job_id}/plans/{plan['id']}/workers/1/3").content)
            for p, s in workers:  # every stream computed once before the clock starts (steady state)
                c.get(f"/v1/jobs/{job_id}/plans/{plan['id']}/workers/{p}/{s}").raise_for_status()
        latencies, errors = run_loop(load(url, job_id, plan["id"], workers, args.clients, args.seconds))
    finally:
        stop_service(proc)
    ms = [v * 1000 for v in latencies]
    print(json.dumps({
        "job": "8x8x24 (gpt-1.5b), failed [[0, 3]]", "clients": args.clients, "seconds": args.seconds,
        "access_log": args.access_log, "requests": len(ms), "errors": errors,
        "throughput_rps": round(len(ms) / args.seconds, 1), "stream_bytes_worker_1_3": size,
        "p50_ms": round(percentile(ms, 0.50), 2), "p90_ms": round(percentile(ms, 0.90), 2),
        "p99_ms": round(percentile(ms, 0.99), 2), "max_ms": round(max(ms), 2),
    }, indent=2))


if __name__ == "__main__":
    main()
