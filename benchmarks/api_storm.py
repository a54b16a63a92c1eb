"""Benchmark: failure storm. 512 worker daemons long-poll their assignment; one failure report;
time until every one of them holds its new generation's instruction stream.

Job: the 16 x 32 GPT-28B scenario (512 workers) with --microbatches (default 8). Two cases: the
failure's plan precomputed (stored) and not (solved on demand). Bars: all 512 within 2 s when
precomputed; within the solve time + 2 s otherwise.

    python benchmarks/api_storm.py [--microbatches 8] [--use-cp]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import httpx
from api_common import Connection, host_port, run_loop, scenario, start_service, stop_service


async def storm(url: str, job_id: str, workers: list, failed: list, after: int) -> dict:
    host, port = host_port(url)
    conns = [await Connection(host, port).open() for _ in workers]
    held: list[float] = []
    statuses: dict[str, int] = {}

    async def daemon(conn: Connection, worker) -> None:
        p, s = worker
        status, body = await conn.request(
            "GET", f"/v1/jobs/{job_id}/workers/{p}/{s}/assignment?after={after}&wait_s=120")
        doc = json.loads(body)
        assert status == 200 and doc["generation"] == after + 1, (status, body[:300])
        statuses[doc["status"]] = statuses.get(doc["status"], 0) + 1
        held.append(time.perf_counter())

    tasks = [asyncio.ensure_future(daemon(c, w)) for c, w in zip(conns, workers, strict=True)]
    await asyncio.sleep(2.0)  # every daemon is parked in its long-poll
    report = await Connection(host, port).open()
    reported = time.perf_counter()
    status, body = await report.request("POST", f"/v1/jobs/{job_id}/failures", {"worker": failed})
    assert status == 200, body
    await asyncio.gather(*tasks)
    for c in conns + [report]:
        await c.close()
    return {"daemons": len(workers), "statuses": statuses,
            "all_hold_new_stream_s": round(max(held) - reported, 3),
            "first_s": round(min(held) - reported, 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--microbatches", type=int, default=8)
    ap.add_argument("--use-cp", action="store_true", help="let the planner run CP-SAT (default: heuristic)")
    args = ap.parse_args()
    spec = scenario("gpt-28b-16x32x96.json", microbatches=args.microbatches)
    workers = [(p, s) for p in range(spec["pipelines"]) for s in range(spec["stages"])]
    results = {}
    for case, failed in (("precomputed", [3, 7]), ("not_precomputed", [5, 20])):
        proc, url, _tmp = start_service(RECYCLE_USE_CP=str(args.use_cp).lower(), RECYCLE_MAX_WAIT_S="300",
                                        RECYCLE_HEARTBEAT_TIMEOUT_S="600")
        try:
            with httpx.Client(base_url=url, timeout=300) as c:
                job_id = c.post("/v1/jobs", json=spec).json()["id"]
                first = c.get(f"/v1/jobs/{job_id}/workers/0/0/assignment", params={"wait_s": 300}).json()
                assert first["generation"] == 1
                solve_s = None
                if case == "precomputed":
                    started = time.perf_counter()
                    plan = c.post(f"/v1/jobs/{job_id}/plans", json={"failed": [failed], "wait_s": 300}).json()
                    assert plan["status"] == "done"
                    solve_s = round(time.perf_counter() - started, 3)
            out = run_loop(storm(url, job_id, workers, failed, after=1))
            with httpx.Client(base_url=url, timeout=60) as c:
                metrics = c.get("/metrics").text
            solve_sum = [ln for ln in metrics.splitlines() if ln.startswith("recycle_solve_seconds_sum")]
            out["solve_seconds_total_in_service"] = float(solve_sum[0].split()[1]) if solve_sum else None
            out["precompute_request_s"] = solve_s
            results[case] = out
        finally:
            stop_service(proc)
    print(json.dumps({"job": f"16x32x{args.microbatches} (gpt-28b)", "use_cp": args.use_cp, **results},
                     indent=2))


if __name__ == "__main__":
    main()
