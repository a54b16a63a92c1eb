"""`recycle submit JOB.json --service URL`: register a job spec (e.g. written by `recycle profile
--app`) with the plan service, precompute its plans, print the job id, and optionally write it to
`--job-file` for `recycle worker --job @FILE`, and the job's worker token to `--worker-token-file`
(readable by its owner only) for `RECYCLE_TOKEN_FILE`: worker processes then hold a credential that
reaches only this job's coordinator routes, never the admin token `submit` itself needs.

Re-running it is safe: when `--job-file` already names a job the service still holds with the same
spec, that job is reused rather than a second one created (a container restarted by its
orchestrator must not fork the job its workers already follow).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

EXIT_OK, EXIT_FAILED, EXIT_INPUT = 0, 1, 2


def _err(message: str) -> None:
    print(f"recycle submit: error: {message}", file=sys.stderr)


def read_job_id(text: str) -> str:
    """`--job` of `recycle worker`: the id itself, or `@PATH` of a file holding it."""
    from cli.worker import WorkerInputError

    if not text.startswith("@"):
        return text
    path = Path(text[1:])
    try:
        job_id = path.read_text().strip()
    except OSError as exc:
        raise WorkerInputError(f"--job: cannot read {path}: {exc.strerror}") from None
    if not job_id:
        raise WorkerInputError(f"--job: {path} is empty (has `recycle submit --job-file` run?)")
    return job_id


def cmd_submit(args: argparse.Namespace) -> int:
    from cli.worker import WorkerInputError, service_token
    from executor.service import ServiceClient, ServiceError
    from planner.spec import JobSpec, SpecError

    try:
        raw = json.loads(Path(args.spec).read_text())
        spec = JobSpec.parse(raw).filled()
    except OSError as exc:
        _err(f"cannot read {args.spec}: {exc.strerror}")
        return EXIT_INPUT
    except json.JSONDecodeError as exc:
        _err(f"{args.spec} is not JSON: {exc}")
        return EXIT_INPUT
    except SpecError as exc:
        _err(f"{args.spec}: {exc}")
        return EXIT_INPUT
    if args.precompute < 0:
        _err(f"--precompute: must be >= 0, got {args.precompute}")
        return EXIT_INPUT
    job_file = Path(args.job_file) if args.job_file else None
    try:
        token = service_token(dict(os.environ))
    except WorkerInputError as exc:
        _err(str(exc))
        return EXIT_INPUT
    client = ServiceClient(args.service, token)
    worker_token = None
    try:
        job_id = _existing(client, job_file, spec)
        if job_id is None:
            job_id = client.create_job(spec)
            print(f"created job {job_id}", file=sys.stderr)
        else:
            print(f"reusing job {job_id} named by {job_file}", file=sys.stderr)
        if args.precompute:
            op = client.precompute(job_id, args.precompute, args.precompute_timeout)
            print(f"precompute up to {args.precompute} failures: {op['status']} ({op['done']}/{op['total']})",
                  file=sys.stderr)
        if args.worker_token_file:
            worker_token = client.worker_token(job_id)
            if worker_token is None:
                raise ServiceError("--worker-token-file: the service runs without authentication, so "
                                   "there is no worker token to write")
    except ServiceError as exc:
        _err(str(exc))
        return EXIT_FAILED
    finally:
        client.close()
    for flag, path, text in (("--job-file", job_file, job_id),
                             ("--worker-token-file", args.worker_token_file, worker_token)):
        if path is not None:
            try:
                _write_atomically(Path(path), text + "\n")
            except OSError as exc:
                _err(f"{flag}: cannot write {path}: {exc.strerror}")
                return EXIT_INPUT
    print(job_id)
    return EXIT_OK


def _write_atomically(path: Path, text: str) -> None:
    """Owner-only, renamed into place: a worker waiting for the file never reads half of it, and a
    token never sits world-readable."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    tmp.replace(path)


def _existing(client, job_file: Path | None, spec: dict) -> str | None:
    """The job `job_file` names, if the service still holds it with this spec."""
    from executor.service import ServiceError

    if job_file is None or not job_file.is_file():
        return None
    job_id = job_file.read_text().strip()
    if not job_id:
        return None
    try:
        held = client._request("GET", f"/v1/jobs/{job_id}", (200,)).json()["spec"]
    except ServiceError:
        return None  # deleted, or another service: register anew
    return job_id if held == spec else None


def register(subparsers: argparse._SubParsersAction, one_line_errors) -> None:
    p = subparsers.add_parser(
        "submit", help="Register a job spec with the plan service and print its id.",
        description="Registers JOB.json (a contract job spec, e.g. from `recycle profile --app`) with "
        "the service, precomputes its plans, prints the job id and writes it to --job-file; reuses the "
        "job that file names if the service holds it with the same spec. The bearer token comes from "
        "RECYCLE_TOKEN or RECYCLE_TOKEN_FILE.",
    )
    one_line_errors(p, "submit")
    p.add_argument("spec", metavar="JOB.json", help="the job spec")
    p.add_argument("--service", required=True, metavar="URL", help="the plan service")
    p.add_argument("--job-file", metavar="PATH", help="write the job id here (read by `recycle worker --job "
                   "@PATH`)")
    p.add_argument("--worker-token-file", metavar="PATH", help="write the job's worker token here, owner-"
                   "readable only (workers read it with RECYCLE_TOKEN_FILE=PATH)")
    p.add_argument("--precompute", type=int, default=1, metavar="K",
                   help="precompute the plans of every failure set up to K workers (default 1; 0: none)")
    p.add_argument("--precompute-timeout", type=float, default=300.0, metavar="SECONDS",
                   help="longest wait for the precompute (default 300; the rest solves on demand)")
    p.set_defaults(run=cmd_submit)
