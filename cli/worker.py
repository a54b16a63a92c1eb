"""`recycle worker` (one process per GPU, on any node) and `recycle rendezvous` (the c10d store the
workers of a job meet at, hosted by a process that outlives them).

A worker learns its place from `--worker P:S`, or from the launcher's environment as torchrun sets
it (`RANK`: pipeline RANK // S, stage RANK % S); the job's layout from the service; the store from
`--store HOST:PORT`, else `RECYCLE_STORE`, else torchrun's `MASTER_ADDR:MASTER_PORT`, else the
address `recycle rendezvous --service` registered with the service; its bearer token
from `RECYCLE_TOKEN` or the file `RECYCLE_TOKEN_FILE` names (never the command line, where `ps`
shows it; a file suits container secrets and `recycle submit --worker-token-file`). It then runs
the same daemon as `recycle train`'s local workers: membership over HTTP, live recovery, rejoin (`--rejoin`).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_INPUT, EXIT_STOPPED = 0, 1, 2, 3


class WorkerInputError(ValueError):
    """A flag or environment value that cannot work; the message names it."""


def parse_endpoint(text: str, what: str) -> tuple[str, int]:
    host, sep, port = text.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise WorkerInputError(f"{what}: expected HOST:PORT, got {text!r}")
    return host, int(port)


def store_address(flag: str | None, env: dict[str, str]) -> tuple[str, int] | None:
    """From the flag or the environment; None: ask the service (`recycle rendezvous --service`)."""
    if flag:
        return parse_endpoint(flag, "--store")
    if env.get("RECYCLE_STORE"):
        return parse_endpoint(env["RECYCLE_STORE"], "RECYCLE_STORE")
    if env.get("MASTER_ADDR") and env.get("MASTER_PORT"):
        return parse_endpoint(f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", "MASTER_ADDR:MASTER_PORT")
    return None


def service_token(env: dict[str, str]) -> str | None:
    """The bearer token: `RECYCLE_TOKEN`, else the contents of the file `RECYCLE_TOKEN_FILE` names;
    None when neither is set (a service without authentication)."""
    if env.get("RECYCLE_TOKEN"):
        return env["RECYCLE_TOKEN"]
    path = env.get("RECYCLE_TOKEN_FILE")
    if not path:
        return None
    try:
        token = Path(path).read_text().strip()
    except OSError as exc:
        raise WorkerInputError(f"RECYCLE_TOKEN_FILE: cannot read {path}: {exc.strerror}") from None
    if not token:
        raise WorkerInputError(f"RECYCLE_TOKEN_FILE: {path} is empty")
    return token


def place(flag: str | None, env: dict[str, str], pipelines: int, stages: int) -> tuple[int, int]:
    """(pipeline, stage) from --worker, else from RANK (rank r = pipeline r // S, stage r % S)."""
    if flag:
        try:
            p, s = (int(v) for v in flag.split(":"))
        except ValueError:
            raise WorkerInputError(f"--worker: expected P:S with integers, got {flag!r}") from None
    elif "RANK" in env:
        if not env["RANK"].isdigit():
            raise WorkerInputError(f"RANK: expected a non-negative integer, got {env['RANK']!r}")
        rank = int(env["RANK"])
        world = env.get("WORLD_SIZE")
        if world is not None and world.isdigit() and int(world) != pipelines * stages:
            raise WorkerInputError(f"WORLD_SIZE: {world} processes, but the job has {pipelines} x {stages} "
                                   f"= {pipelines * stages} workers")
        p, s = divmod(rank, stages)
    else:
        raise WorkerInputError("--worker: give P:S, or start the process under torchrun (RANK)")
    if not (0 <= p < pipelines and 0 <= s < stages):
        raise WorkerInputError(f"--worker: {p}:{s} is outside the job's {pipelines} x {stages} workers")
    return p, s


def cmd_worker(args: argparse.Namespace) -> int:
    from cli.submit import read_job_id
    from executor.app import AppError, load_app, validate_app
    from executor.service import ServiceClient, ServiceError

    env = dict(os.environ)
    try:
        token = service_token(env)
        if args.iterations < 1:
            raise WorkerInputError(f"--iterations: must be >= 1, got {args.iterations}")
        check_checkpoint_options(args)
        given_store = store_address(args.store, env)
        job_id = read_job_id(args.job)
        client = ServiceClient(args.service, token)
        # The membership route answers the admin token and the job's worker token alike.
        state = client.membership(job_id)
        store_host, store_port = given_store or _service_store(client, job_id, 2 * args.operation_timeout)
        job = state["spec"]
        D, S, M = job["pipelines"], job["stages"], job["microbatches"]
        worker = place(args.worker, env, D, S)
        # A place the service already knows is a restart (e.g. a container its orchestrator brought
        # back): it must rejoin rather than start training from scratch.
        registered = state["workers"]
        rejoin = args.rejoin or any(w["worker"] == list(worker) for w in registered)
        client.close()
        local_rank = int(env["LOCAL_RANK"]) if env.get("LOCAL_RANK", "").isdigit() else None
        if args.device == "cuda":
            import torch

            if not torch.cuda.is_available():
                raise WorkerInputError("--device: cuda was asked for but torch sees no CUDA device")
        app = load_app(args.app)
        validate_app(app, S)
    except (WorkerInputError, AppError) as exc:
        print(f"recycle worker: error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    except ServiceError as exc:
        print(f"recycle worker: error: {exc}", file=sys.stderr)
        return EXIT_FAILED
    from executor.process import worker_main
    from executor.worker_spec import WorkerSpec

    spec = WorkerSpec(
        worker=worker, pipelines=D, stages=S, microbatches=M, iterations=args.iterations, generation=0,
        alive=[], stream={}, model={}, app=args.app, store_host=store_host, store_port=store_port,
        device=args.device, local_rank=local_rank, bind_host=args.host, threads=args.threads,
        operation_timeout_s=args.operation_timeout, group_setup_timeout_s=2 * args.operation_timeout,
        service_url=args.service, job_id=job_id, service_token=token,
        rejoin_at=0 if rejoin else None, checkpoint_dir=args.checkpoint_dir,
        checkpoint_every=args.checkpoint_every, resume=args.resume, stage_lost_wait_s=args.stage_lost_wait,
        snapshot_memory=args.snapshot_memory,
    )
    result = Path(args.report or f"{os.environ.get('TMPDIR', '/tmp')}/recycle-worker-{os.getpid()}.pt")
    print(f"recycle worker {worker[0]}:{worker[1]} (pipeline:stage) of job {job_id}: store "
          f"{store_host}:{store_port}, device {args.device}", file=sys.stderr, flush=True)
    return worker_main(spec.to_json(), str(result))  # exits the process (live mode)


def cmd_rendezvous(args: argparse.Namespace) -> int:
    import datetime

    import torch.distributed as dist

    try:
        store = dist.TCPStore(args.host, args.port, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=60))
    except (RuntimeError, OSError) as exc:
        print(f"recycle rendezvous: error: cannot listen on {args.host}:{args.port}: {exc}", file=sys.stderr)
        return EXIT_INPUT
    address = f"{args.advertise or _reachable(args.host)}:{store.port}"
    if args.service or args.job:
        from cli.submit import read_job_id
        from executor.service import ServiceClient, ServiceError

        if not (args.service and args.job):
            print("recycle rendezvous: error: --service and --job go together", file=sys.stderr)
            return EXIT_INPUT
        try:  # workers started without --store read it from the service
            client = ServiceClient(args.service, service_token(dict(os.environ)))
            client.set_rendezvous(read_job_id(args.job), address)
            client.close()
        except (ServiceError, WorkerInputError) as exc:
            print(f"recycle rendezvous: error: {exc}", file=sys.stderr)
            return EXIT_FAILED
    print(json.dumps({"store": address}), flush=True)
    stop: dict[str, Any] = {"now": False}
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.update(now=True))
    while not stop["now"]:
        time.sleep(0.2)
    return EXIT_OK


def _service_store(client, job_id: str, wait_s: float) -> tuple[str, int]:
    from executor.service import ServiceError

    try:
        return parse_endpoint(client.rendezvous(job_id, wait_s), "the service's rendezvous address")
    except ServiceError as exc:
        raise WorkerInputError(f"--store: none given (--store, RECYCLE_STORE, MASTER_ADDR/MASTER_PORT) "
                               f"and {exc}") from None


def _reachable(host: str) -> str:
    """The address other nodes use for a store listening on `host` (a wildcard: this host's name)."""
    import socket

    return socket.getfqdn() if host in ("0.0.0.0", "::", "") else host


def checkpoint_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint-dir", metavar="DIR", help="write torch.distributed.checkpoint directories "
                   "DIR/step-K (keys stages.S.NAME; one replica per stage writes)")
    p.add_argument("--checkpoint-every", type=int, default=0, metavar="N",
                   help="checkpoint every N iterations (default 0: never)")
    p.add_argument("--resume", action="store_true", help="start from the newest complete checkpoint in "
                   "--checkpoint-dir")
    p.add_argument("--stage-lost-wait", type=float, default=600.0, metavar="SECONDS",
                   help="when a stage loses every worker, wait this long for one to rejoin it (then all "
                   "restore the newest checkpoint) before stopping (default 600)")
    p.add_argument("--snapshot-memory", choices=("host", "device"), default="host",
                   help="with --device cuda: keep the rollback snapshots (two copies of the stage's "
                   "parameters and optimizer state) in pinned host memory, copied while the next "
                   "iteration runs (default), or in GPU memory")


def check_checkpoint_options(args: argparse.Namespace) -> None:
    if args.checkpoint_every < 0:
        raise WorkerInputError(f"--checkpoint-every: must be >= 0, got {args.checkpoint_every}")
    if not args.stage_lost_wait > 0:
        raise WorkerInputError(f"--stage-lost-wait: must be > 0 seconds, got {args.stage_lost_wait}")
    if (args.checkpoint_every or args.resume) and not args.checkpoint_dir:
        raise WorkerInputError("--checkpoint-dir: needed by --checkpoint-every and --resume")
    if args.checkpoint_dir and Path(args.checkpoint_dir).exists() and not Path(args.checkpoint_dir).is_dir():
        raise WorkerInputError(f"--checkpoint-dir: {args.checkpoint_dir} is not a directory")


def register(subparsers: argparse._SubParsersAction, one_line_errors) -> None:
    w = subparsers.add_parser(
        "worker", help="One worker daemon (one per GPU) of a job served by `recycle serve`.",
        description="Runs one worker of a job: pulls its instruction stream from the service, trains "
        "the app's stage, survives peers' failures and rejoins after its own restart (--rejoin). The "
        "bearer token comes from RECYCLE_TOKEN or RECYCLE_TOKEN_FILE.",
    )
    one_line_errors(w, "worker")
    w.add_argument("--service", required=True, metavar="URL", help="the plan service")
    w.add_argument("--job", required=True, metavar="JOB_ID", help="the job's id at the service, or @FILE "
                   "holding it (as `recycle submit --job-file` writes)")
    w.add_argument("--app", required=True, metavar="MODULE:ATTR", help="the training app (contracts.md)")
    w.add_argument("--worker", metavar="P:S", help="pipeline:stage (default: from RANK as torchrun sets it)")
    w.add_argument("--store", metavar="HOST:PORT", help="the rendezvous store (default: RECYCLE_STORE, "
                   "else MASTER_ADDR:MASTER_PORT, else the address `recycle rendezvous --service` "
                   "registered with the service for this job)")
    w.add_argument("--host", metavar="ADDR", help="this node's address for the worker's connections "
                   "(default: the host name's)")
    w.add_argument("--iterations", "-N", type=int, default=8, help="training iterations (default 8)")
    w.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="cpu (gloo) or cuda (NCCL)")
    w.add_argument("--rejoin", action="store_true", help="this is a restarted worker: rejoin the job "
                   "(implied when the service already has this worker registered)")
    w.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    w.add_argument("--operation-timeout", type=float, default=60.0,
                   help="bound on one send/receive/all-reduce, seconds (default 60)")
    w.add_argument("--report", metavar="FILE", help="write this worker's results (torch.save) here")
    checkpoint_options(w)
    w.set_defaults(run=cmd_worker)
    r = subparsers.add_parser(
        "rendezvous", help="Host the c10d store that a job's `recycle worker` processes meet at.",
        description="Hosts a torch.distributed TCPStore until SIGTERM; prints its address as JSON. It "
        "must outlive the workers. With --service and --job it registers its address with the service, "
        "so workers need no --store (token from RECYCLE_TOKEN or RECYCLE_TOKEN_FILE).",
    )
    one_line_errors(r, "rendezvous")
    r.add_argument("--host", default="0.0.0.0", help="address to listen on (default 0.0.0.0)")
    r.add_argument("--port", type=int, default=29400, help="port (default 29400; 0 picks a free one)")
    r.add_argument("--advertise", metavar="HOST", help="the address workers reach the store at (default: "
                   "--host, or this host's name when --host is a wildcard)")
    r.add_argument("--service", metavar="URL", help="register the store's address with this plan service")
    r.add_argument("--job", metavar="JOB_ID", help="... for this job (its id, or @FILE holding it)")
    r.set_defaults(run=cmd_rendezvous)
