"""Micro-benchmark: the server's CPU cost of one head-answered heartbeat, in process.

The 4,096-daemon benchmark (`api_daemons.py`) measures latency end to end on a shared box, where
one run's p99 varies 54-176 ms with the other sessions' load. This one feeds the exact bytes a
daemon sends (`api_common.Connection`: token, registration id, content-length 0) into the real
protocol class (`api.protocol` with `api.fastpath.HeadBeats`) of the real app, over fake
transports, one keep-alive connection per worker, and reports CPU microseconds per beat (best of
`--rounds`), so a change to the beat path can be compared side by side in seconds. `--profile`
prints a cProfile of one round.

    python benchmarks/beat_path.py [--pipelines 16 --stages 16] [--beats 20000] [--rounds 5]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import logging
import pstats
import sys
import tempfile
import time
from pathlib import Path

import httpx
from uvicorn.config import Config
from uvicorn.server import ServerState

from api.fastpath import HeadBeats
from api.main import create_app
from api.protocol import guarded_protocol
from api.settings import Settings

TOKEN = "bench-admin-token-0123456789"


class Transport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = 0

    def write(self, data) -> None:
        self.written += 1

    def close(self) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name, default=None):
        return {"sockname": ("127.0.0.1", 8000), "peername": ("127.0.0.1", 50000)}.get(name, default)


async def main(args) -> None:
    tmp = tempfile.TemporaryDirectory(prefix="recycle-beatpath-")
    logging.disable(logging.INFO)  # the app's access log of the registrations
    settings = Settings(database_url=f"sqlite:///{tmp.name}/b.db", api_token=TOKEN, use_cp=False)
    app = create_app(settings)
    async with app.router.lifespan_context(app):
        admin = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t",
                                     headers=admin, timeout=60) as c:
            spec = json.loads((Path(__file__).resolve().parents[2] / "shared" / "scenarios"
                               / "uniform-4x4x8.json").read_text())
            spec.update(pipelines=args.pipelines, stages=args.stages, microbatches=8)
            created = (await c.post("/v1/jobs", json=spec)).json()
            job_id, token = created["id"], created["worker_token"]
            workers = [(p, s) for p in range(args.pipelines) for s in range(args.stages)]
            regs = {}
            for p, s in workers:
                r = await c.post(f"/v1/jobs/{job_id}/workers/{p}/{s}/heartbeat", json={"pid": 1000 + p},
                                 headers={"Authorization": f"Bearer {token}"})
                regs[(p, s)] = r.json()["registration"]
        cls = guarded_protocol(65536, 100, 10.0, 30.0, quick=HeadBeats(app, TOKEN))
        config = Config(app=app, http=cls, lifespan="off", timeout_keep_alive=60)
        config.load()
        state = ServerState()
        conns = []
        for p, s in workers:
            protocol = cls(config=config, server_state=state, app_state={})
            transport = Transport()
            protocol.connection_made(transport)
            head = (f"POST /v1/jobs/{job_id}/workers/{p}/{s}/heartbeat HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                    f"Content-Length: 0\r\nContent-Type: application/json\r\nAuthorization: Bearer {token}"
                    f"\r\nX-Recycle-Registration: {regs[(p, s)]}\r\n\r\n").encode()
            conns.append((protocol, transport, head))

        def round_(n: int) -> float:
            started = time.process_time()  # CPU time: other sessions' load on the box is not counted
            for i in range(n):
                protocol, _, head = conns[i % len(conns)]
                protocol.data_received(head)
            return (time.process_time() - started) / n * 1e6

        round_(len(conns))  # every connection once (first beats, caches)
        written = sum(t.written for _, t, _ in conns)
        assert written == len(conns) and not state.tasks, (written, len(state.tasks))
        best = min(round_(args.beats) for _ in range(args.rounds))
        print(json.dumps({"workers": len(conns), "beats": args.beats,
                          "cpu_us_per_beat_best": round(best, 2)}))
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
            round_(args.beats)
            prof.disable()
            pstats.Stats(prof, stream=sys.stdout).sort_stats("tottime").print_stats(25)
        for protocol, _, _ in conns:
            protocol.connection_lost(None)


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pipelines", type=int, default=16)
    ap.add_argument("--stages", type=int, default=16)
    ap.add_argument("--beats", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--profile", action="store_true")
    import uvloop  # the service's loop (uvicorn picks it when installed)

    uvloop.run(main(ap.parse_args()))
