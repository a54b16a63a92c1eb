"""Benchmark: a stored plan's worker instruction streams under 64 concurrent clients.

Starts `recycle serve` (SQLite), registers the 8 x 8 x 24 GPT-1.5B job, stores the plan of one
failure, then 64 keep-alive clients fetch random alive workers' streams for --seconds. Reports
latency percentiles and throughput. Bar: p99 < 20 ms on the 2-core machine.

    python benchmarks/api_instructions.py [--clients 64] [--seconds 10] [--access-log] [--client wrk]

`--client python` (default) drives the load from an asyncio process on the same 2 cores; `--client wrk`
uses wrk (Debian package `wrk`, C, one thread), which leaves the server most of a core and so measures
the service rather than the load generator.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

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


def load_with_wrk(url: str, job_id: str, plan_id: str, workers: list, clients: int, seconds: float) -> dict:
    """wrk cycling through the alive workers' stream URLs; its latency distribution, parsed."""
    if shutil.which("wrk") is None:
        raise SystemExit("wrk not found: apt-get install wrk (or use --client python)")
    paths = ",".join(f'"/v1/jobs/{job_id}/plans/{plan_id}/workers/{p}/{s}"' for p, s in workers)
    script = ("counter = 0\nlocal paths = {" + paths + "}\n"
              "request = function()\n  counter = counter + 1\n"
              "  return wrk.format('GET', paths[(counter % #paths) + 1])\nend\n")
    with tempfile.TemporaryDirectory() as tmp:
        lua = Path(tmp) / "streams.lua"
        lua.write_text(script)
        out = subprocess.run(["wrk", "-t1", f"-c{clients}", f"-d{int(seconds)}s", "--latency", "-s", str(lua),
                              url], capture_output=True, text=True, timeout=seconds + 60, check=True).stdout

    def to_ms(value: str, unit: str) -> float:
        return float(value) * {"us": 1e-3, "ms": 1.0, "s": 1e3}[unit]

    def ms(label: str) -> float:
        return to_ms(*re.search(rf"{label}\s+([\d.]+)(us|ms|s)\b", out).groups())

    # "Latency  avg  stdev  max  +/-stdev": the third figure is the maximum.
    latency = re.findall(r"([\d.]+)(us|ms|s)\b", re.search(r"Latency(.*)", out).group(1))

    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"client": "wrk -t1", "requests": int(re.search(r"(\d+) requests in", out).group(1)),
            "errors": int(errors.group(1)) if errors else 0,
            "throughput_rps": float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1)),
            "p50_ms": ms("50%"), "p90_ms": ms("90%"), "p99_ms": ms("99%"), "max_ms": to_ms(*latency[2])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=64)
    ap.add_argument("--seconds", type=float, default=10.0)
    ap.add_argument("--access-log", action="store_true", help="keep the per-request log line on")
    ap.add_argument("--client", choices=("python", "wrk"), default="python", help="load generator")
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
        if args.client == "wrk":
            result = load_with_wrk(url, job_id, plan["id"], workers, args.clients, args.seconds)
        else:
            latencies, errors = run_loop(load(url, job_id, plan["id"], workers, args.clients, args.seconds))
    finally:
        stop_service(proc)
    if args.client == "wrk":
        print(json.dumps({"job": "8x8x24 (gpt-1.5b), failed [[0, 3]]", "clients": args.clients,
                          "seconds": args.seconds, "stream_bytes_worker_1_3": size, **result}, indent=2))
        return
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
