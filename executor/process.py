"""A worker process's entry point: `python -m executor.process SPEC.json RESULT.pt`.

Launchers (`recycle train`'s one-host cluster, `recycle worker`) start one such process per worker;
it trains, then writes its results, or the error that stopped it, to RESULT.pt with torch.save.
"""

from __future__ import annotations

import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

import torch

from executor.comms import GenerationGroups, Timeouts, connect_store
from executor.runtime import Worker
from executor.worker_spec import WorkerSpec
from planner.instructions import InstructionStream


def _finish_together(store, spec: WorkerSpec, timeouts: Timeouts) -> None:
    """Exit barrier over the store. A completed gloo send only means the bytes left this process;
    a worker that exited right after could close the connection before its peer has read them, and
    the peer's receive would fail. So nobody exits before every worker of the generation is done."""
    key = f"gen{spec.generation}/finished"
    store.add(key, 1)
    deadline = time.monotonic() + timeouts.operation_s
    while store.add(key, 0) < len(spec.alive):
        if time.monotonic() > deadline:
            raise TimeoutError(f"peers did not finish within {timeouts.operation_s:.0f} s of this worker")
        time.sleep(0.01)


def _write(out: dict[str, Any], result_path: str) -> None:
    tmp = Path(f"{result_path}.tmp{os.getpid()}")
    torch.save(out, tmp)
    tmp.replace(result_path)


def worker_main(spec_json: str, result_path: str) -> int:
    """Process entry point: train `spec.iterations` iterations, write results (or the error) to
    `result_path` with torch.save. Never hangs: every wait is bounded by the operation timeout."""
    spec = WorkerSpec.from_json(spec_json)
    torch.set_num_threads(spec.threads)
    if spec.service_url:
        return _live_main(spec, result_path)
    out: dict[str, Any]
    try:
        timeouts = Timeouts(spec.operation_timeout_s, spec.group_setup_timeout_s)
        store = connect_store(spec.store_host, spec.store_port, timeouts.group_setup_s)
        groups = GenerationGroups(store, spec.generation, spec.alive, spec.worker, timeouts, spec.device,
                                  gradient_group=spec.gradient_group)
        worker = Worker(spec)
        worker.signature_store = store
        worker.attach(groups, InstructionStream.model_validate(spec.stream))
        started = time.time()
        for it in range(spec.iterations):
            worker.run_iteration(it)
        _finish_together(store, spec, timeouts)
        out = {**worker.results(), "started_s": started, "error": None}
    except Exception as exc:  # reported to the launcher, which names the worker
        out = {"worker": list(spec.worker), "error": f"{type(exc).__name__}: {exc}",
               "traceback": traceback.format_exc()}
    _write(out, result_path)
    return 0


def _live_main(spec: WorkerSpec, result_path: str) -> int:
    """A worker following the service (executor.daemon). It leaves with `os._exit`: threads blocked
    in abandoned generations' gloo calls must not hold up (or crash) interpreter shutdown."""
    from executor.daemon import daemon_main

    try:
        out, code = daemon_main(spec)
    except Exception as exc:
        out, code = {"worker": list(spec.worker), "error": f"{type(exc).__name__}: {exc}",
                     "traceback": traceback.format_exc()}, 1
    _write(out, result_path)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    """`python -m executor.process SPEC.json RESULT.pt`: how launchers start a worker process."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m executor.process SPEC.json RESULT.pt", file=sys.stderr)
        return 2
    return worker_main(Path(args[0]).read_text(), args[1])


if __name__ == "__main__":
    raise SystemExit(main())
