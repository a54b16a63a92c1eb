"""`recycle worker` processes started by hand as if on separate hosts: each pipeline's workers bind
their connections to their own loopback address (127.0.0.2, 127.0.0.3), meet at a `recycle
rendezvous` store, follow the real service, survive a SIGKILL and take the restarted worker back;
the losses equal single-process training of the same app. Bad flags: one line, exit 2."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
import torch
import torch.distributed as dist

from executor.app import load_app
from executor.fault_points import generation_key, record_key
from executor.local import uniform_job
from executor.reference import train_reference_app
from executor.service import LocalService, ServiceClient

APP = "tests.executor.apps.skipnet:app"
HOSTS = {0: "127.0.0.2", 1: "127.0.0.3"}
ITERATIONS = 40
SLOW = {"SKIPNET_FORWARD_SLEEP_S": "0.1"}
ADMIN = "admin-token-for-the-worker-test"  # ~0.2 s an iteration: training outlasts the restart


def _worker(service, job, store, w, log, extra=(), env=None):
    """`store` None: the worker reads the store's address from the service."""
    where = ["--store", store] if store else []
    cmd = [sys.executable, "-m", "cli.main", "worker", "--service", service.url, "--job", job, "--app", APP,
           *where, "--host", HOSTS[w[0]], "--iterations", str(ITERATIONS),
           "--operation-timeout", "20", "--report", str(log.with_suffix(".pt")), *extra]
    return subprocess.Popen(cmd, stdout=log.open("wb"), stderr=subprocess.STDOUT,
                            env={**os.environ, **SLOW, **(env or {})})


@pytest.mark.slow
def test_hand_started_workers_on_two_addresses_survive_a_kill_and_take_the_worker_back(tmp_path):
    torch.set_num_threads(1)
    # With authentication on, the workers hold only the job's worker token (issue 9, finding 10): it
    # reads the job through its membership, binds each registration to its process, and the
    # restarted worker is let in once the killed one is declared failed.
    env = {"RECYCLE_USE_CP": "false", "RECYCLE_SOLVE_TIME_LIMIT_S": "2", "RECYCLE_API_TOKEN": ADMIN}
    with LocalService(tmp_path, env) as service:
        client = ServiceClient(service.url, ADMIN)
        job = client.create_job(uniform_job(2, 2, 2).filled())
        worker_env = {"RECYCLE_TOKEN": client.worker_token(job)}
        client.precompute(job, 1, timeout_s=60)
        # The store registers its address with the service (worker token): pipeline 1's workers get
        # it from there, pipeline 0's from --store.
        rdzv = subprocess.Popen([sys.executable, "-m", "cli.main", "rendezvous", "--host", "127.0.0.1",
                                 "--port", "0", "--service", service.url, "--job", job],
                                stdout=subprocess.PIPE, text=True, env={**os.environ, **worker_env})
        procs = {}
        try:
            store = json.loads(rdzv.stdout.readline())["store"]
            for w in [(0, 0), (0, 1), (1, 0)]:
                given = store if w[0] == 0 else None
                procs[w] = _worker(service, job, given, w, tmp_path / f"w{w[0]}{w[1]}.log",
                                   ["--worker", f"{w[0]}:{w[1]}"], worker_env)
            # The fourth takes its place from torchrun's variables: rank 3 of 4 = pipeline 1, stage 1.
            assert client.rendezvous(job, 0) == store
            procs[1, 1] = _worker(service, job, None, (1, 1), tmp_path / "w11.log",
                                  env={"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", **worker_env})
            host, port = store.rsplit(":", 1)
            watch = dist.TCPStore(host, int(port), is_master=False)
            deadline = time.monotonic() + 120
            while not (watch.check(["progress/1:1"]) and int(watch.get("progress/1:1")) >= 3):
                assert time.monotonic() < deadline, "training did not reach iteration 2"
                assert all(p.poll() is None for p in procs.values()), "a worker exited early"
                time.sleep(0.05)
            procs[1, 1].send_signal(signal.SIGKILL)
            procs[1, 1].wait(10)
            # Restarted with the very same command (as an orchestrator restarts a container): no
            # --rejoin; the service knowing 1:1 already makes it rejoin.
            procs["rejoined"] = _worker(service, job, None, (1, 1), tmp_path / "w11-rejoin.log",
                                        env={"RANK": "3", "LOCAL_RANK": "1", "WORLD_SIZE": "4", **worker_env})
            for name, p in procs.items():
                if name == (1, 1):
                    continue
                log = tmp_path / ("w11-rejoin.log" if name == "rejoined" else f"w{name[0]}{name[1]}.log")
                assert p.wait(180) == 0, log.read_text()[-2000:]
            # No launcher reports this run from the store, so the workers left no per-iteration keys
            # there (over a long run they would grow the rendezvous store without bound).
            last = ITERATIONS - 1
            assert not any(watch.check([key]) for key in (f"loss/{last}", record_key(last, (0, 1)),
                                                           generation_key(1, (0, 1))))
        finally:
            for p in [*procs.values(), rdzv]:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
            membership = client.membership(job)
    generations = [g["failed"] for g in rejoined_generations(tmp_path)]
    assert [[1, 1]] in generations, generations  # the kill became a generation without 1:1 ...
    last = torch.load(tmp_path / "w01.pt", weights_only=False)
    ref = train_reference_app(load_app(APP), 2, 2, 2, ITERATIONS)
    assert last["error"] is None
    assert len(last["losses"]) == ITERATIONS
    for it, (got, want) in enumerate(zip(last["losses"], ref.losses, strict=True)):
        assert abs(got - want) <= 1e-5 * abs(want), f"iteration {it}: {got} vs {want}"
    rejoined = torch.load(tmp_path / "w11-rejoin.pt", weights_only=False)
    for name, t in ref.stage_parameters[1].items():
        assert float((rejoined["parameters"][name] - t).norm() / t.norm()) <= 1e-5, name
    assert membership["failed"] == [], membership  # ... and the rejoin one with it again


@pytest.mark.parametrize(("args", "env", "message"), [
    (["--worker", "5:0"], {}, "outside the job's 2 x 2 workers"),
    (["--worker", "x"], {}, "--worker: expected P:S"),
    ([], {}, "give P:S, or start the process under torchrun"),
    ([], {"RANK": "1", "WORLD_SIZE": "8"}, "WORLD_SIZE: 8 processes"),
    (["--worker", "0:0", "--store", "nohost"], {}, "--store: expected HOST:PORT"),
    (["--worker", "0:0", "--iterations", "0"], {}, "--iterations: must be >= 1"),
])
def test_bad_worker_flags_are_one_line_exit_2(tmp_path, args, env, message):
    with LocalService(tmp_path) as service:
        job = ServiceClient(service.url).create_job(uniform_job(2, 2, 2).filled())
        base = [sys.executable, "-m", "cli.main", "worker", "--service", service.url, "--job", job,
                "--app", APP, "--store", "127.0.0.1:1"]
        clean = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR")}
        proc = subprocess.run([*base, *args], capture_output=True, text=True, timeout=120,
                              env={**clean, **env})
    assert proc.returncode == 2, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and message in proc.stderr, proc.stderr


def rejoined_generations(tmp_path):
    return torch.load(tmp_path / "w00.pt", weights_only=False)["generations"]


def test_no_store_anywhere_is_one_line_exit_2_after_a_bounded_wait(tmp_path):
    with LocalService(tmp_path) as service:
        job = ServiceClient(service.url).create_job(uniform_job(2, 2, 2).filled())
        clean = {k: v for k, v in os.environ.items()
                 if k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "RECYCLE_STORE")}
        proc = subprocess.run([sys.executable, "-m", "cli.main", "worker", "--service", service.url,
                               "--job", job, "--app", APP, "--worker", "0:0", "--operation-timeout", "1"],
                              capture_output=True, text=True, timeout=120, env=clean)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "--store: none given" in lines[0] and "recycle rendezvous" in lines[0], lines
