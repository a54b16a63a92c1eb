"""A live local cluster: D x S worker processes that follow the service, with injected faults.

The launcher hosts the c10d `TCPStore` (it outlives every worker), starts each worker as its own
process (`python -m executor.process`, live mode: the instruction stream comes from the service's
assignment), and plays the node agent:

- `Fault(worker, iteration, phase, signal)`: the worker announces reaching that phase of that
  iteration through the store and waits; the launcher then sends SIGKILL (or SIGSTOP, a hang) so
  the fault lands exactly there. Faults with the same iteration and phase fire together (within
  `GROUP_WINDOW_S` of the first reaching its point). After a SIGKILL the agent reports the dead
  process to the coordinator (`agent_reports`; survivors also report broken connections themselves,
  and the heartbeat timeout catches what neither sees, e.g. a SIGSTOP).
- `Rejoin(worker, iteration)`: right after the worker is killed a replacement process starts (so
  its imports overlap training), waits until training has completed `iteration` iterations, then
  registers a rejoin and copies its stage's state from a live peer.

Every wait is bounded by `timeout_s`; at the end every process it started is gone.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import signal
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from executor.data import DataConfig
from executor.fault_points import PHASES, generation_key, hold_release_key, reached_key, record_key
from executor.local import _start_worker
from executor.model import ConfigError, ModelConfig
from executor.optim import OptimConfig
from executor.reference import TrainingResult
from executor.service import ServiceClient, ServiceError
from executor.worker_spec import WorkerSpec

GROUP_WINDOW_S = 1.0
POLL_S = 0.02


@dataclass(frozen=True)
class Fault:
    worker: tuple[int, int]
    iteration: int
    phase: str = "forward"
    signal: str = "kill"  # kill (SIGKILL) or stop (SIGSTOP: a hung worker)

    @property
    def point(self) -> str:
        return f"{self.iteration}:{self.phase}"


@dataclass(frozen=True)
class Rejoin:
    worker: tuple[int, int]
    iteration: int


def _worker(text: str, what: str) -> tuple[int, int]:
    try:
        p, s = (int(v) for v in text.split(":"))
    except ValueError:
        raise ConfigError(f"{what}: expected P:S with integers, got {text!r}", what) from None
    return p, s


def parse_kill(text: str) -> Fault:
    """`P:S@ITER[:PHASE]`."""
    head, sep, tail = text.partition("@")
    if not sep:
        raise ConfigError(f"kill: expected P:S@ITER[:PHASE], got {text!r}", "kill")
    it_text, _, phase = tail.partition(":")
    phase = phase or "forward"
    if phase not in PHASES:
        raise ConfigError(f"kill: phase must be one of {', '.join(PHASES)}, got {phase!r}", "kill")
    try:
        iteration = int(it_text)
    except ValueError:
        raise ConfigError(f"kill: ITER must be an integer, got {it_text!r}", "kill") from None
    return Fault(_worker(head, "kill"), iteration, phase)


def parse_rejoin(text: str) -> Rejoin:
    """`P:S@ITER`."""
    head, sep, tail = text.partition("@")
    try:
        iteration = int(tail)
    except ValueError:
        iteration = -1
    if not sep or iteration < 0:
        raise ConfigError(f"rejoin: expected P:S@ITER, got {text!r}", "rejoin")
    return Rejoin(_worker(head, "rejoin"), iteration)


def check_faults(pipelines: int, stages: int, iterations: int, faults: list[Fault],
                 rejoins: list[Rejoin]) -> None:
    """Refuse fault plans that name workers outside D x S, iterations outside the run, two faults of
    one worker, or a rejoin with no earlier kill of that worker."""
    seen: dict[tuple[int, int], Fault] = {}
    for f in faults:
        p, s = f.worker
        if not (0 <= p < pipelines and 0 <= s < stages):
            raise ConfigError(f"kill: worker {p}:{s} is outside {pipelines} pipelines x {stages} stages",
                              "kill")
        if not 0 <= f.iteration < iterations:
            raise ConfigError(f"kill: iteration {f.iteration} is outside 0..{iterations - 1}", "kill")
        if f.worker in seen:
            raise ConfigError(f"kill: worker {p}:{s} is named twice (one fault per worker)", "kill")
        seen[f.worker] = f
    for r in rejoins:
        f = seen.get(r.worker)
        if f is None or f.signal != "kill":
            raise ConfigError(f"rejoin: worker {r.worker[0]}:{r.worker[1]} has no --kill to come back from",
                              "rejoin")
        if not f.iteration < r.iteration < iterations:
            raise ConfigError(f"rejoin: iteration {r.iteration} must be after the kill ({f.iteration}) and "
                              f"before the end ({iterations})", "rejoin")


class LiveRunError(RuntimeError):
    """The run did not complete; `partial` holds what the workers left (e.g. a stopped job)."""

    def __init__(self, message: str, partial: dict[tuple[int, int], dict] | None = None):
        super().__init__(message)
        self.partial = partial or {}


@dataclass
class LiveRun(TrainingResult):
    iterations: list[dict[str, Any]] = field(default_factory=list)
    """Per iteration: iteration, loss, iteration_ms (measured), predicted_ms, generation."""
    failures: list[dict[str, Any]] = field(default_factory=list)
    """Per fault: worker, iteration, phase, signal, recovery_ms (kill to the first iteration done
    under the new plan, minus one normal iteration), detected_ms (kill to the next generation)."""
    generations: list[dict[str, Any]] = field(default_factory=list)
    crashed_logs: dict[str, str] = field(default_factory=dict)
    """Every worker process that exited with an error while the run went on ("P:S" -> its error,
    traceback and log tail, each of its lives that crashed in turn), kept because the run's
    directory is deleted when it ends."""


@dataclass
class _Proc:
    popen: subprocess.Popen
    result: Path
    state: str = "running"  # running, done, stopped, killed, hung, crashed
    rejoin_at: int | None = None


class LiveCluster:
    def __init__(self, service_url: str, job_id: str, pipelines: int, stages: int, microbatches: int,
                 iterations: int, model: ModelConfig, data: DataConfig | None = None,
                 optim: OptimConfig | None = None, faults: list[Fault] | None = None,
                 rejoins: list[Rejoin] | None = None, token: str | None = None, agent_reports: bool = True,
                 timeout_s: float = 300.0, operation_timeout_s: float = 60.0, threads: int = 1,
                 app: str | None = None, checkpoint_dir: str | None = None, checkpoint_every: int = 0,
                 resume: bool = False, stage_lost_wait_s: float = 600.0, device: str = "cpu",
                 snapshot_memory: str = "host"):
        self.service_url, self.job_id, self.token = service_url, job_id, token
        self.D, self.S, self.M, self.N = pipelines, stages, microbatches, iterations
        self.model, self.data, self.optim = model, data or DataConfig(), optim or OptimConfig()
        self.faults, self.rejoins = list(faults or []), list(rejoins or [])
        check_faults(pipelines, stages, iterations, self.faults, self.rejoins)
        self.app, self.device = app, device
        self.checkpoint = {"checkpoint_dir": checkpoint_dir, "checkpoint_every": checkpoint_every,
                           "resume": resume, "stage_lost_wait_s": stage_lost_wait_s,
                           "snapshot_memory": snapshot_memory}
        if app is None:
            model.stage_layers(stages)
        self.agent_reports, self.timeout_s = agent_reports, timeout_s
        self.operation_timeout_s, self.threads = operation_timeout_s, threads
        self.client = ServiceClient(service_url, token)
        self.worker_token: str | None = None
        """What the worker processes authenticate with: the job's own worker token (fetched with the
        launcher's admin token), never the admin token itself, so a worker can touch only this job's
        coordinator routes."""
        self.fired: list[tuple[Fault, float]] = []
        self.posted_losses: dict[int, float] = {}
        self.posted_records: dict[int, list[dict]] = {}
        self.posted_generations: list[dict] = []

    def _spec(self, w: tuple[int, int], port: int, rejoin_at: int | None) -> WorkerSpec:
        return WorkerSpec(
            worker=w, pipelines=self.D, stages=self.S, microbatches=self.M, iterations=self.N,
            generation=0, alive=[], stream={}, model=self.model.to_json(), data=self.data.__dict__,
            app=self.app, **self.checkpoint, optim=self.optim.to_json(), store_port=port, device=self.device,
            threads=self.threads,
            operation_timeout_s=self.operation_timeout_s,
            group_setup_timeout_s=max(2 * self.operation_timeout_s, 30.0),
            service_url=self.service_url, job_id=self.job_id, service_token=self.worker_token,
            rejoin_at=rejoin_at,
            pause_at=[f.point for f in self.faults if f.worker == w and rejoin_at is None],
            hold_at=[[r.iteration, *r.worker] for r in self.rejoins], post_progress=True,
        )

    def run(self, progress=None) -> LiveRun:
        """Train; `progress(completed_iterations)` is called as training advances."""
        self.worker_token = self.client.worker_token(self.job_id) if self.token else None
        store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                              timeout=datetime.timedelta(seconds=self.timeout_s))
        keep = os.environ.get("RECYCLE_KEEP_RUN_DIR")  # debugging: keep worker logs and specs
        run_dir = (contextlib.nullcontext(tempfile.mkdtemp(prefix="recycle-live-", dir=keep)) if keep
                   else tempfile.TemporaryDirectory(prefix="recycle-live-"))
        with run_dir as tmp:
            self.tmp = Path(tmp)
            procs: list[tuple[tuple[int, int], _Proc]] = []
            try:
                for w in [(p, s) for p in range(self.D) for s in range(self.S)]:
                    procs.append((w, self._start(w, store.port, None, 0)))
                self._supervise(store, procs, progress)
                # Losses every last-stage worker posted, including those killed since (their
                # results are gone): a run restored from a checkpoint still reports iteration 0 on.
                self.posted_losses = {i: float(store.get(f"loss/{i}")) for i in range(self.N)
                                      if store.check([f"loss/{i}"])}
                self.posted_records, self.posted_generations = self._posted(store)
                outputs = self._outputs(procs)
                crashed: dict[str, str] = {}
                for w, proc in procs:  # a worker that rejoined and crashed again: both reports
                    if proc.state == "crashed":
                        key = f"{w[0]}:{w[1]}"
                        crashed[key] = crashed.get(key, "") + self._crash_report(w, proc)
            finally:
                for _, proc in procs:
                    if proc.popen.poll() is None:
                        proc.popen.kill()
                        proc.popen.wait(10)
        run = self._collect(outputs)
        run.crashed_logs = crashed
        return run

    def _start(self, w: tuple[int, int], port: int, rejoin_at: int | None, life: int) -> _Proc:
        name = f"worker-{w[0]}-{w[1]}-{life}"
        spec_path = self.tmp / f"{name}.json"
        spec_path.write_text(self._spec(w, port, rejoin_at).to_json())
        result = self.tmp / f"{name}.pt"
        return _Proc(_start_worker(spec_path, result, self.tmp / f"{name}.log"), result, rejoin_at=rejoin_at)

    def _supervise(self, store: dist.TCPStore, procs: list, progress) -> None:
        pending = list(self.faults)
        reached_at: dict[Fault, float] = {}
        deadline = time.monotonic() + self.timeout_s
        best = 0
        while True:
            now = time.monotonic()
            for f in pending:
                key = reached_key(f.worker)
                if f not in reached_at and store.check([key]) and store.get(key).decode() == f.point:
                    reached_at[f] = now
            due = [f for f in reached_at if f in pending and all(
                g in reached_at or now - reached_at[f] > GROUP_WINDOW_S
                for g in pending if (g.iteration, g.phase) == (f.iteration, f.phase))]
            for f in due:
                pending.remove(f)
                self._fire(f, store.port, procs)
            for w, proc in procs:
                if proc.state == "running" and proc.popen.poll() is not None:
                    code = proc.popen.returncode
                    proc.state = {0: "done", 3: "stopped"}.get(code, "crashed")
                    if proc.rejoin_at is not None and proc.state != "done":
                        store.set(hold_release_key(proc.rejoin_at), "1")  # nobody waits for it
                    if proc.state == "crashed" and self.agent_reports:
                        self._report(w, f"process exited with code {code}")
            done = [int(store.get(f"progress/{p}:{s}")) for p in range(self.D) for s in range(self.S)
                    if store.check([f"progress/{p}:{s}"])]
            if done and progress is not None and max(done) > best:
                best = max(done)
                progress(best)
            if all(proc.state != "running" for _, proc in procs):
                return
            if time.monotonic() > deadline:
                running = [list(w) for w, p in procs if p.state == "running"]
                raise LiveRunError(f"workers {running} did not finish within {self.timeout_s:.0f} s "
                                   f"(logs in the run directory were: {self._log_tails(procs)})")
            time.sleep(POLL_S)

    def _fire(self, f: Fault, port: int, procs: list) -> None:
        proc = next(p for w, p in reversed(procs) if w == f.worker)
        if f.signal == "stop":
            proc.popen.send_signal(signal.SIGSTOP)
            proc.state = "hung"
            self.fired.append((f, time.time()))
            return
        proc.popen.send_signal(signal.SIGKILL)
        proc.popen.wait(10)
        proc.state = "killed"
        self.fired.append((f, time.time()))
        if self.agent_reports:
            self._report(f.worker, f"killed by the launcher at iteration {f.iteration} ({f.phase})")
        for r in self.rejoins:
            if r.worker == f.worker:
                procs.append((f.worker, self._start(f.worker, port, r.iteration, 1)))

    def _report(self, w: tuple[int, int], reason: str) -> None:
        with contextlib.suppress(ServiceError):  # survivors and the heartbeat timeout still detect it
            self.client.report_failure(self.job_id, w, reason)

    def _crash_report(self, w: tuple[int, int], proc: _Proc) -> str:
        """A crashed worker's error and traceback (from its result file: the worker catches what
        the model raised and writes it there), then its log tail."""
        report = ""
        if proc.result.exists():
            out = torch.load(proc.result, weights_only=False)
            report = f"{out.get('error', '')}\n{out.get('traceback', '')}"
        return report + self._log_tails([(w, proc)])

    def _log_tails(self, procs: list) -> str:
        tails = []
        for w, proc in procs:
            log = proc.result.with_suffix(".log")
            if log.exists():
                tails.append(f"\n--- {list(w)} ({proc.state}):\n{log.read_text(errors='replace')[-1500:]}")
        return "".join(tails)

    def _outputs(self, procs: list) -> dict[tuple[int, int], dict]:
        outputs: dict[tuple[int, int], dict] = {}
        problems = []
        for w, proc in procs:
            if proc.state in ("killed", "hung"):
                continue
            if not proc.result.exists():
                problems.append(f"worker {list(w)} exited with code {proc.popen.returncode} and no result")
                continue
            out = torch.load(proc.result, weights_only=False)
            if out.get("error"):
                problems.append(f"worker {list(w)}: {out['error']}")
                if proc.state == "crashed":
                    problems[-1] += "\n" + out.get("traceback", "")
            outputs[w] = out
        finished = {w: o for w, o in outputs.items() if not o.get("error")}
        stages_done = {w[1] for w in finished}
        if problems and len(stages_done) < self.S:
            raise LiveRunError("training stopped: " + "; ".join(dict.fromkeys(problems)) + self._log_tails(
                [(w, p) for w, p in procs if p.state == "crashed"]), outputs)
        return finished

    def _posted(self, store: dist.Store) -> tuple[dict[int, list[dict]], list[dict]]:
        """Every worker's posted iteration ends and generation starts, the killed ones' included: a
        stage that lost all its workers, or a one-worker job, has no finished process that holds its
        first iterations."""
        workers = [(p, s) for p in range(self.D) for s in range(self.S)]

        def read(keys: list[str]) -> list[dict]:
            return [json.loads(store.get(k)) for k in keys if store.check([k])]

        records = {i: read([record_key(i, w) for w in workers]) for i in range(self.N)}
        newest = max((r["generation"] for recs in records.values() for r in recs), default=0)
        generations = [g for gen in range(1, newest + 1)
                       for g in read([generation_key(gen, w) for w in workers])]
        return records, generations

    # ------------------------------------------------------------------------------ results
    def _collect(self, outputs: dict[tuple[int, int], dict]) -> LiveRun:
        stage_parameters = []
        for s in range(self.S):
            replicas = [out for (p, q), out in sorted(outputs.items()) if q == s]
            if not replicas:
                raise LiveRunError(f"stage {s}: no replica finished")
            for other in replicas[1:]:
                for name, t in replicas[0]["parameters"].items():
                    if not torch.equal(t, other["parameters"][name]):
                        raise LiveRunError(f"stage {s}: replicas disagree on {name} after training")
            stage_parameters.append(replicas[0]["parameters"])
        losses = dict(self.posted_losses)
        for (_, s), out in outputs.items():
            if s == self.S - 1:
                losses.update(out["loss_by_iteration"])
        # A resumed run starts at its checkpoint's step, not at iteration 0.
        its = list(range(min(losses, default=0), self.N))
        missing = [i for i in its if i not in losses]
        if missing or not its:
            raise LiveRunError(f"no finished last-stage replica holds the loss of iterations {missing}")
        ends, gens, predicted = {}, {}, {}
        for i in its:
            # A posted record of a worker that later redid the iteration (after a restore) ended
            # before the redo, so the latest end is the iteration's end either way.
            recs = [out["records"][i] for out in outputs.values() if i in out["records"]]
            recs += self.posted_records.get(i, [])
            if not recs:
                raise LiveRunError(f"iteration {i}: no worker recorded its end")
            last = max(recs, key=lambda r: r["end_s"])
            ends[i] = last["end_s"]
            gens[i] = max(r["generation"] for r in recs)
            predicted[i] = last["predicted_ms"]
        every_generation = [g for out in outputs.values() for g in out["generations"]]
        every_generation += self.posted_generations
        starts = [g["started_s"] for g in every_generation]
        iteration_ms = {i: (ends[i] - (ends[i - 1] if i - 1 in ends else min(starts))) * 1e3 for i in its}
        iterations = [{"iteration": i, "loss": losses[i], "iteration_ms": round(iteration_ms[i], 3),
                       "predicted_ms": round(predicted[i], 3) if predicted[i] else None,
                       "generation": gens[i]} for i in its]
        first_gen = [iteration_ms[i] for i in its[1:] if gens[i] == gens[its[0]]]
        normal_ms = statistics.median(first_gen or iteration_ms.values())
        failures = []
        for f, t_fault in self.fired:
            before = [gens[i] for i in its if ends[i] < t_fault]
            gen_at = max(before) if before else gens[its[0]]
            after = [ends[i] for i in its if gens[i] > gen_at and ends[i] > t_fault]
            # A generation that began before this kill cannot be the one that noticed it (a kill
            # can land after the job has moved on, e.g. a stage's second worker while the first is
            # being replaced).
            new_gen = [g for g in every_generation if g["generation"] > gen_at and g["started_s"] > t_fault]
            failures.append({
                "worker": list(f.worker), "iteration": f.iteration, "phase": f.phase, "signal": f.signal,
                "recovery_ms": round((min(after) - t_fault) * 1e3 - normal_ms, 3) if after else None,
                "detected_ms": round((min(g["started_s"] for g in new_gen) - t_fault) * 1e3, 3)
                if new_gen else None,
            })
        fields = ("generation", "restart", "restored", "failed", "reason")
        by_number = {g["generation"]: {k: g.get(k) for k in fields} for g in every_generation}
        generations = sorted(by_number.values(), key=lambda g: g["generation"])
        return LiveRun(losses=[losses[i] for i in its], stage_parameters=stage_parameters,
                       iterations=iterations, failures=failures, generations=generations)
