"""A worker that follows the service's membership generations and survives peer failures.

Recovery is by iteration rollback (docs/notes/executor.md). Per generation G the worker:

1. posts how many iterations it has completed (`gen{G}/at/{p}:{s}`; -1 for a rejoiner holding no
   state) and waits for every alive worker's number; the restart point R is the smallest;
2. builds G's gloo groups (`PrefixStore("gen{G}")`, its own store connection);
3. rolls back to R: drops in-flight work and, if it had already stepped past R, restores its
   pre-step snapshot; a stage with a rejoiner broadcasts the lowest stateful replica's parameters
   and AdamW state over the new stage group;
4. runs iterations R.. under G's instruction stream.

When a stage has lost every replica the coordinator answers `waiting` rather than a plan: workers
keep polling (bounded by `stage_lost_wait_s`) until a worker rejoins that stage. In the generation
that brings it back no alive replica of that stage holds state, so in-memory copying is impossible:
the lowest alive worker picks the newest complete checkpoint (step 0, the initial state, if there is
none) and publishes it as `gen{G}/restore`; every worker loads its stage from it and R is its step.

A worker the coordinator declares failed while it is alive (its assignment says `excluded`) drops
its state and rejoins at once, like a restarted worker: a delayed heartbeat costs one re-plan, not
a process.

Any wait can be cut short: a newer settled generation (the long-poll thread sets `changed`)
raises `Interrupted` within 50 ms; a broken connection raises `PeerLost`, which is reported to the
coordinator (`POST .../failures`) before waiting for the generation it causes. Micro-batch data is a
pure function of (iteration, home, index), so rerunning R under the new plan counts every micro-batch
exactly once and reproduces the fault-free run.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

from executor.comms import GenerationGroups, Interrupted, PeerLost, Timeouts, connect_store, interruptible
from executor.fault_points import FaultPoints, generation_key, record_key
from executor.membership import Membership, MembershipError, alive_workers
from executor.runtime import Worker
from executor.worker_spec import WorkerSpec
from planner.instructions import InstructionStream

EXIT_OK, EXIT_STOPPED = 0, 3


DONE_KEY = "training/done"
"""Set by each worker that sees every worker of a generation finish the last iteration: from
then on training is complete whatever membership changes follow (a finished peer has left, and its
silence must not make the others rerun or wait for a rejoin)."""


class Finished(Exception):
    """A wait was cut short because training is complete (`DONE_KEY`)."""


class TrainingStopped(RuntimeError):
    """The coordinator stopped the job (a stage has no surviving replica and none came back)."""


def log(name: str, message: str) -> None:
    """One line per membership event on stderr (the worker's log file under the launcher)."""
    print(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} worker {name}: {message}",
          file=sys.stderr, flush=True)


def key(worker: tuple[int, int]) -> str:
    return f"{worker[0]}:{worker[1]}"


class Daemon:
    def __init__(self, spec: WorkerSpec):
        if not (spec.service_url and spec.job_id):
            raise ValueError("a live worker needs service_url and job_id")
        self.spec = spec
        self.timeouts = Timeouts(spec.operation_timeout_s, spec.group_setup_timeout_s)
        self.store = connect_store(spec.store_host, spec.store_port, self.timeouts.group_setup_s)
        self.member = Membership(spec.service_url, spec.job_id, spec.worker, spec.service_token)
        self.worker = Worker(spec)
        self.worker.keep_snapshots = True
        self.worker.signature_store = self.store
        # the test-only seam: None for every worker a user starts (no pause or hold points)
        self.faults = FaultPoints.of(self.store, spec.worker, spec.pause_at, spec.hold_at,
                                     self.timeouts.operation_s, self.member.changed)
        if self.faults is not None:
            self.worker.before_phase = self.faults.pause
        self.has_state = spec.rejoin_at is None
        self.generations: list[dict[str, Any]] = []
        self.barrier: tuple[str, int] | None = None
        """(counter key, workers) of the last exit barrier this worker entered."""
        self.name = key(spec.worker)

    # ------------------------------------------------------------------------------ main loop
    def run(self) -> dict[str, Any]:
        spec = self.spec
        self.member.register()
        after = 0
        if spec.rejoin_at is not None:
            self._wait_for_progress(spec.rejoin_at)
            after = self.member.rejoin()["generation"] - 1
        self.member.start(after)
        current = after
        waiting = False
        while True:
            try:
                a = self.member.wait_newer(current, spec.stage_lost_wait_s if waiting
                                           else self.timeouts.group_setup_s)
            except MembershipError:
                if waiting and not self.member.error:
                    raise TrainingStopped(f"generation {current}: {a['reason']}; none came within "
                                          f"{spec.stage_lost_wait_s:g} s") from None
                raise
            current = a["generation"]
            self.member.adopt(current)
            log(self.name, f"generation {current} {a['status']} failed={a['failed']} ({a['reason']})")
            if self._finished():
                log(self.name, f"training finished before generation {current}: leaving")
                return self._result(None)
            if a["status"] == "excluded":
                # Declared failed while alive (heartbeats delayed past the timeout under load, too
                # slow for its peers, or an operator's report): come back as a rejoiner that holds no
                # state, so a replica copies it the stage's parameters, instead of leaving the job.
                # Excluded in the exit barrier, it first waits for its peers to finish: dropping the
                # final state of a finished run would leave it waiting for peers that have left.
                if self._await_finish():
                    log(self.name, f"training finished; excluded from generation {current} after it")
                    return self._result(None)
                log(self.name, f"excluded from generation {current}: rejoining")
                self.worker.runner.drop_in_flight()
                self.has_state = False
                current = self.member.rejoin()["generation"] - 1
                continue
            waiting = a["status"] == "waiting"
            if waiting:
                self.worker.runner.drop_in_flight()
                continue  # a stage lost every worker: wait (bounded) for one to rejoin it
            if a["status"] != "running":
                if self.worker.completed >= spec.iterations and self.has_state:
                    return self._result(None)  # finished before the job stopped
                raise TrainingStopped(f"generation {current} is {a['status']}: {a['reason']}")
            try:
                self._run_generation(a)
                return self._result(None)
            except Finished:
                log(self.name, f"training finished during generation {current}'s setup: leaving")
                return self._result(None)
            except Interrupted as exc:
                log(self.name, f"interrupted in generation {current}: {exc}")
                continue
            except PeerLost as exc:
                log(self.name, f"peer lost in generation {current}: {str(exc)[:300]}")
                if exc.peer is not None:
                    self.member.report_failure(exc.peer, str(exc))
                # Whoever broke must become a new generation (reported here, by the launcher, or by
                # the heartbeat timeout); wait for it rather than retry the old one.
                self.member.wait_newer(current, self.timeouts.group_setup_s)

    def _wait_for_progress(self, iteration: int) -> None:
        """A restarted worker comes back once training has reached `iteration` (any alive worker
        completed that many), bounded by the operation timeout times the iterations left."""
        alive = [(p, s) for p in range(self.spec.pipelines) for s in range(self.spec.stages)]
        deadline = time.monotonic() + self.timeouts.operation_s * max(1, iteration)
        next_status_check = 0.0
        while time.monotonic() < deadline:
            done = [int(self.store.get(f"progress/{key(w)}")) for w in alive
                    if w != self.spec.worker and self.store.check([f"progress/{key(w)}"])]
            if done and max(done) >= iteration:
                return
            if time.monotonic() > next_status_check:  # no progress can come: a stage waits for us
                if self.member.job_status() == "waiting":
                    return
                next_status_check = time.monotonic() + 0.5
            time.sleep(0.05)
        raise TimeoutError(f"training did not reach iteration {iteration} to rejoin at")

    def _run_generation(self, a: dict[str, Any]) -> None:
        spec, worker, store, interrupt = self.spec, self.worker, self.store, self.member.changed
        gen = a["generation"]
        alive = alive_workers(a)
        stream = InstructionStream.model_validate(a["instructions"])
        store.set(f"gen{gen}/at/{self.name}", str(worker.completed if self.has_state else -1))
        at = self._gather(gen, alive)
        lost = sorted({w[1] for w in alive} - {w[1] for w in alive if at[w] >= 0})
        restored = self._restore_point(gen, alive, lost) if lost else None
        restart = restored if restored is not None else min(c for c in at.values() if c >= 0)
        log(self.name, f"generation {gen}: restart at iteration {restart} (progress {sorted(at.items())}"
            + (f"; stage {lost} lost all state: restore checkpoint step {restored})" if lost else ")"))
        gen_store = connect_store(spec.store_host, spec.store_port, self.timeouts.group_setup_s)
        groups = interruptible(
            lambda: GenerationGroups(gen_store, gen, alive, spec.worker, self.timeouts, spec.device,
                                     interrupt, spec.bind_host, spec.gradient_group),
            interrupt, f"generation {gen} group setup")
        if restored is not None:
            worker.restore_checkpoint(restored)
            self.has_state = True
        elif self.has_state:
            worker.rollback_to(restart)
        stage = [w for w in alive if w[1] == spec.worker[1]]
        log(self.name, f"generation {gen}: groups ready")
        if restored is None and any(at[w] < 0 for w in stage):
            holders = [w for w in stage if at[w] >= 0]
            worker.share_state(groups, holders[0], restart)
            self.has_state = True
            log(self.name, f"stage state copied from {list(holders[0])}")
        worker.attach(groups, stream, a.get("iteration_ms") or 0.0)
        self.generations.append({"generation": gen, "restart": restart, "restored": restored,
                                 "started_s": time.time(),
                                 "failed": a["failed"], "predicted_ms": a.get("iteration_ms"),
                                 "reason": a.get("reason")})
        if spec.post_progress:
            store.set(generation_key(gen, spec.worker), json.dumps(self.generations[-1]))
        failed = {tuple(w) for w in a["failed"]}
        holds = self.faults.holds(failed) if self.faults is not None else set()
        for it in range(restart, spec.iterations):
            if it in holds and self.faults.hold(it):
                raise Interrupted(f"rejoin at iteration {it}")
            if interrupt.is_set():
                # A newer generation takes effect at the next iteration boundary at the latest: one
                # that breaks no connection (an excluded live worker, a rejoin) interrupts no wait.
                raise Interrupted(f"generation {gen} before iteration {it}")
            worker.run_iteration(it)
            # The launcher's copy of the loss and of when the iteration ended: it outlives this
            # process if it is killed (a job that loses every worker keeps no other record of them).
            if spec.post_progress:
                if it in worker.losses:
                    store.set(f"loss/{it}", repr(worker.losses[it]))
                store.set(record_key(it, spec.worker), json.dumps(worker.records[it]))
            store.set(f"progress/{self.name}", str(worker.completed))
        self._finish_together(gen, alive)

    def _restore_point(self, gen: int, alive: list[tuple[int, int]], lost: list[int]) -> int:
        """The checkpoint step every worker restores (agreed through the store: the lowest alive
        worker reads the directory once, so a checkpoint finishing meanwhile cannot split them)."""
        spec, name = self.spec, f"gen{gen}/restore"
        if spec.worker == alive[0]:
            newest = None
            if spec.checkpoint_dir:
                from executor.checkpoint import latest_complete

                newest = latest_complete(spec.checkpoint_dir)
            step = newest[0] if newest else 0
            log(self.name, f"stage {lost} has no replica holding state: every worker restores "
                + (f"checkpoint step-{step}" if step else "the initial state (no complete checkpoint)"))
            self.store.set(name, str(step))
        self._wait_keys([name], gen, "restore point", "no restore point")
        return int(self.store.get(name))

    def _wait_keys(self, keys: list[str], gen: int, point: str, missing: str) -> None:
        """Until every key is in the store; a newer generation interrupts the wait, and none within
        the group-setup timeout is an error naming what is `missing`."""
        deadline = time.monotonic() + self.timeouts.group_setup_s
        while not self.store.check(keys):
            if self._finished():
                raise Finished
            if self.member.changed.is_set():
                raise Interrupted(f"generation {gen} {point}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"generation {gen}: {missing} within "
                                   f"{self.timeouts.group_setup_s:.0f} s")
            time.sleep(0.01)

    def _gather(self, gen: int, alive: list[tuple[int, int]]) -> dict[tuple[int, int], int]:
        keys = [f"gen{gen}/at/{key(w)}" for w in alive]
        self._wait_keys(keys, gen, "restart point", "peers did not post their progress")
        return {w: int(self.store.get(k)) for w, k in zip(alive, keys, strict=True)}

    def _finish_together(self, gen: int, alive: list[tuple[int, int]]) -> None:
        """Nobody leaves before every worker of the generation is done (a finished gloo send only
        means the bytes left; see runtime._finish_together). Interruptible: a peer failing before
        it finishes means a new generation, and this worker may have to rerun its last iteration."""
        counter = f"gen{gen}/finished"
        self.store.add(counter, 1)
        self.barrier = (counter, len(alive))
        deadline = time.monotonic() + self.timeouts.operation_s
        while self.store.add(counter, 0) < len(alive):
            if self._finished():
                return  # a peer saw everyone finish, then a membership change came: still done
            if self.member.changed.is_set():
                raise Interrupted(f"generation {gen} exit barrier")
            if time.monotonic() > deadline:
                raise TimeoutError(f"peers did not finish within {self.timeouts.operation_s:.0f} s")
            time.sleep(0.01)
        self.store.set(DONE_KEY, str(gen))

    def _holds_final_state(self) -> bool:
        return self.has_state and self.worker.completed >= self.spec.iterations

    def _finished(self) -> bool:
        """Training is complete (a peer saw everyone finish, or every worker of the exit barrier this
        worker entered has entered it) and this worker holds its final state."""
        if not self._holds_final_state():
            return False
        if self.store.check([DONE_KEY]):
            return True
        return self.barrier is not None and self.store.add(self.barrier[0], 0) >= self.barrier[1]

    def _await_finish(self) -> bool:
        """For a worker holding the final state: whether its exit barrier completes within the
        operation timeout (False at once for a worker that has not finished)."""
        if not self._holds_final_state():
            return False
        deadline = time.monotonic() + self.timeouts.operation_s
        while time.monotonic() < deadline:
            if self._finished():
                return True
            time.sleep(0.01)
        return False

    def _result(self, error: str | None) -> dict[str, Any]:
        return {**self.worker.results(), "generations": self.generations, "error": error}


def daemon_main(spec: WorkerSpec) -> tuple[dict[str, Any], int]:
    """Run a live worker; returns (result, exit code). A stopped job ends with EXIT_STOPPED and
    a result holding the last consistent state (no half-applied step: see `stopped_state`)."""
    daemon = Daemon(spec)
    try:
        return {**daemon.run(), "started_s": daemon.generations[0]["started_s"]
                if daemon.generations else time.time()}, EXIT_OK
    except (TrainingStopped, MembershipError) as exc:
        daemon.worker.runner.drop_in_flight()
        return {**daemon._result(f"{type(exc).__name__}: {exc}"), "stopped": True}, EXIT_STOPPED
    finally:
        daemon.member.stop()
