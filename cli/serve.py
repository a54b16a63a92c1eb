"""`recycle serve`: argument definitions only; FastAPI and uvicorn are imported when it runs."""

from __future__ import annotations

import argparse
import sys

KEEP_ALIVE_S = 60
GC_PAUSE_LOGGED_S = 0.05
BEAT_SWITCH_INTERVAL_S = 0.0002
"""The interpreter's switch interval with the heartbeat thread on (default 5 ms). uvloop waits for
the kernel without the GIL and takes it back for every I/O callback, so while the main thread works
(a wake-up) each beat the heartbeat thread reads waits up to one interval for the GIL: at 5 ms
that thread answered ~200 beats/s of the 4,096 arriving, and beats begun during a wake-up waited
0.2-0.4 s; at 0.2 ms none waited over 50 ms in two runs (docs/benchmarks.md)."""


def register(subparsers: argparse._SubParsersAction) -> None:
    parser = subparsers.add_parser(
        "serve", help="run the plan service (REST API + coordinator)",
        description="Run the plan service under uvicorn. Settings not given here come from RECYCLE_* "
        "environment variables (see docs/notes/api.md).")
    parser.add_argument("--host", default=None, help="bind address (default 127.0.0.1; RECYCLE_HOST)")
    parser.add_argument("--port", type=int, default=None, help="port (default 8000; RECYCLE_PORT)")
    parser.add_argument("--database-url", default=None,
                        help="sqlite:///FILE (default sqlite:///recycle.db) or postgresql+psycopg://...")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    import uvicorn
    from pydantic import ValidationError

    from api.main import create_app
    from api.settings import Settings

    overrides = {k: v for k, v in (("host", args.host), ("port", args.port),
                                   ("database_url", args.database_url)) if v is not None}
    from api.lease import Lease, LeaseHeld

    try:
        settings = Settings(**overrides)
        settings.check()
        _check_reachable(settings)
        lease = Lease(settings.database_url).acquire()  # held until this process ends
    except LeaseHeld as exc:
        print(f"recycle serve: error: {exc}", file=sys.stderr)
        return 2
    except ValidationError as exc:
        first = exc.errors()[0]
        name = str(first["loc"][0]) if first["loc"] else "settings"
        flag = f"--{name.replace('_', '-')}" if name in overrides else f"RECYCLE_{name.upper()}"
        print(f"recycle serve: error: {flag}: {first['msg']}, got {first.get('input')!r}", file=sys.stderr)
        return 2
    except ValueError as exc:
        print(f"recycle serve: error: {exc}", file=sys.stderr)
        return 2
    if settings.host not in ("127.0.0.1", "localhost", "::1") and settings.api_token is None:
        print(f"recycle serve: warning: listening on {settings.host} without RECYCLE_API_TOKEN",
              file=sys.stderr)
    app = create_app(settings)
    http, beat_loop = http_protocol(app, settings)
    config = uvicorn.Config(app, host=settings.host, port=settings.port,
                            log_level=settings.log_level.lower(), access_log=False, http=http,
                            timeout_graceful_shutdown=5, limit_concurrency=None, backlog=2048,
                            # Worker daemons keep one connection each and beat every second: with
                            # uvicorn's 5 s, a server busy for 5 s (4,095 answers after a failure at
                            # 4,096 daemons) closed thousands of them whose next beat was waiting.
                            timeout_keep_alive=KEEP_ALIVE_S,
                            h11_max_incomplete_event_size=settings.max_header_bytes)
    server = server_class()(config)
    server.beat_loop = beat_loop
    _quiet_gc()
    try:
        if beat_loop is not None:
            sys.setswitchinterval(BEAT_SWITCH_INTERVAL_S)
            beat_loop.start(server.server_state)
        server.run()
    finally:
        if beat_loop is not None:
            beat_loop.stop()
        lease.close()
    return 0


def http_protocol(app, settings, keep_alive_s: float = KEEP_ALIVE_S):
    """uvicorn's HTTP protocol class for `app` with the service's limits and head-answered beats,
    and the heartbeat thread (`api.beat_loop`; None when `settings.beat_thread` is off) that the
    caller starts with the server's state and stops when it stops (`server_class` does)."""
    from api.beat_loop import BeatLoop
    from api.fastpath import HeadBeats
    from api.protocol import guarded_protocol

    token = settings.api_token.get_secret_value() if settings.api_token is not None else None
    quick = HeadBeats(app, token)
    beat_loop = None
    if settings.beat_thread:
        beat_loop = BeatLoop(quick, keep_alive_s=keep_alive_s, header_timeout_s=settings.header_timeout_s,
                             max_header_bytes=settings.max_header_bytes, max_headers=settings.max_headers)
        app.state.metrics.watch_beat_loop(beat_loop)
    http = guarded_protocol(settings.max_header_bytes, settings.max_headers, settings.header_timeout_s,
                            settings.body_timeout_s, quick=quick, beat_loop=beat_loop)
    return http, beat_loop


def _quiet_gc() -> None:
    """Fewer, shorter garbage-collector pauses for the serving process.

    The service holds millions of long-lived container objects (plans, streams' sources, thousands
    of connections) and each request allocates a few dozen short-lived ones, so with the default
    thresholds (700, 10, 10) full collections ran every few seconds at 4,096 daemons and each
    walked the whole heap: 0.6-4.6 s pauses measured in the server (gc callbacks, 2-core box under
    load), during which no heartbeat is read. Objects from start-up are frozen (never garbage,
    never scanned again); young collections run every 20,000 allocations instead of 700, and a
    full one after 100 middle ones. Not 50,000 (as before 2026-11-23): cyclic garbage waits for a
    young collection, and in 60 s of abuse (16 MiB heads, 200 MB bodies) it piled up to a 535 MB
    server between them (283 MB at 20,000; 139 MB at 5,000, but at 5,000 a 4,096-daemon failure
    not precomputed had a whole-run beat p99 of 365-481 ms in three runs, cause not isolated; the
    interpreter's defaults: 90 MB). A wake-up of a large job holds collection meanwhile
    (`api.gc_pauses`), which also runs a full collection when the process doubles. Pauses over
    50 ms are logged."""
    import gc
    import time

    from api import logs

    gc.collect()
    gc.freeze()
    gc.set_threshold(20_000, 20, 100)
    log = logs.get("service")
    started = [0.0]

    def pauses(phase: str, info: dict) -> None:
        # A collection holds the GIL: the heartbeat thread waits too. Long ones are logged.
        if phase == "start":
            started[0] = time.perf_counter()
        elif (paused := time.perf_counter() - started[0]) > GC_PAUSE_LOGGED_S:
            log.warning("garbage collection paused the service", extra={
                "seconds": round(paused, 3), "generation": info["generation"],
                "collected": info["collected"]})

    gc.callbacks.append(pauses)
    from api import gc_pauses

    gc_pauses.install()


def server_class():
    import asyncio

    import uvicorn

    class Server(uvicorn.Server):
        beat_loop = None

        async def shutdown(self, sockets=None) -> None:
            """The heartbeat thread's connections close with the listeners, before uvicorn waits
            for the main loop's connections to finish."""
            if self.beat_loop is not None:
                self.beat_loop.stop()
            await super().shutdown(sockets)

        def handle_exit(self, sig, frame) -> None:
            """SIGTERM/SIGINT: answer the coordinator's long-polls before uvicorn starts closing
            connections (a signal handler runs on the loop's thread: schedule it, thread-safely)."""
            app = self.config.app
            services = getattr(getattr(app, "state", None), "services", None)
            try:
                loop = asyncio.get_running_loop()
            except RuntimeError:
                loop = None
            if services is not None and loop is not None:
                loop.call_soon_threadsafe(services.coordinator.close_polls)
            super().handle_exit(sig, frame)

    return Server


def _check_reachable(settings) -> None:
    """Fail before uvicorn starts, in one line: a database URL that cannot be used, a port taken."""
    import socket

    import sqlalchemy
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError, NoSuchModuleError, SQLAlchemyError

    try:
        url = make_url(settings.database_url)
        engine = sqlalchemy.create_engine(url)
        with engine.connect():
            pass
        engine.dispose()
    except (ArgumentError, NoSuchModuleError) as exc:
        raise ValueError(f"--database-url: cannot use {settings.database_url!r}: {exc}") from None
    except SQLAlchemyError as exc:
        reason = " ".join(str(exc.orig if getattr(exc, "orig", None) else exc).split())[:200]
        raise ValueError(f"--database-url: cannot connect to {settings.database_url!r}: {reason}") from None
    family = socket.AF_INET6 if ":" in settings.host else socket.AF_INET
    with socket.socket(family) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((settings.host, settings.port))
        except OSError as exc:
            raise ValueError(f"--host/--port: cannot listen on {settings.host}:{settings.port}: "
                             f"{exc.strerror}") from None


if __name__ == "__main__":  # `python -m cli.serve` runs the service without the recycle dispatcher

    ns = argparse.ArgumentParser(prog="python -m cli.serve")
    sub = ns.add_subparsers(dest="command", required=True)
    register(sub)
    args = ns.parse_args(sys.argv[1:] or ["serve"])
    sys.exit(args.run(args))
