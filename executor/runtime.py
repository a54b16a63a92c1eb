"""Run one worker's instruction stream, iteration after iteration, with torch.distributed P2P.

A worker process gets a `WorkerSpec` (its stream, the model and training options, where the
c10d store is, the membership generation), builds that generation's groups, and executes each
instruction in order:

- RECV: wait for a receive that was posted ahead of time (a small window of receives is kept in
  flight so transfers overlap compute), posted per peer in the sender's order (`executor/receives.py`:
  NCCL matches by order, not by tag);
- F / B / W: `AppStageRunner` over the training app's stage (the built-in model is an app too,
  `executor/data.py`); stage 0 loads its inputs and the last stage its targets itself from the
  app's dataset by the contract's addressing, so a re-routed micro-batch needs nothing from its
  home pipeline;
- SEND: non-blocking send, completed before the iteration ends (the tensor is kept alive until then);
- ALLREDUCE: one flat buffer of the stage's gradients (the last stage appends its loss sum) summed
  over the stage's alive replicas; every micro-batch loss was scaled by 1 / (D x M), so the sum is
  the gradient of the global batch's mean loss whatever failed;
- OPTIMIZER: this stage's optimizer step, with no barrier against other stages.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from executor.app import build_stage, load_app
from executor.app_stage import (
    AppStageRunner,
    ReplicaState,
    decode_signature,
    encode_signature,
    gradient_signature,
    nbytes,
    pack,
    to_device,
    unpack,
)
from executor.comms import GenerationGroups, Interrupted, torch_device
from executor.data import builtin_app
from executor.fault_points import pause_positions
from executor.receives import Receives
from executor.timing import OpTimer
from executor.worker_spec import WorkerSpec
from planner.instructions import Instruction, InstructionStream

RECV_WINDOW = 4
"""Receives posted ahead of the one being waited for (bounded: each holds one activation buffer)."""


SNAPSHOTS_KEPT = 2
"""States kept for rollback, each taken when the replica reached it (after a step, a restore or a
copy from a peer): a worker is at most one iteration ahead of the slowest peer when a generation
changes (a stage starts iteration k + 1 only after its own step k, and the last stage finishes
k + 1 only after stage 0 started it), so after n steps the rollback target is n or n - 1."""


class Worker:
    """One [pipeline, stage] worker: its model replica and optimizer, plus the groups and stream
    of the membership generation it currently runs (`attach`)."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.p, self.s = spec.worker
        self.device = torch_device(spec.device, self.p * spec.stages + self.s if spec.local_rank is None
                                   else spec.local_rank)
        scale = 1.0 / (spec.pipelines * spec.microbatches)
        # One path: the built-in model runs as a training app like any user's.
        self.app = load_app(spec.app) if spec.app else builtin_app(spec.model, spec.data, spec.optim)
        self._signatures: dict[int, list] = {}
        self._published = False
        self.signature_store: Any = None
        """The c10d store where app stages publish their output signatures (set by the launcher)."""
        self.module = build_stage(self.app, self.s, spec.stages).to(self.device)
        self.runner = AppStageRunner(self.module, self.app, self.s, spec.stages, scale)
        self.optimizer = self.app.optimizer(self.module.parameters())
        self.replica = ReplicaState(self.module, self.optimizer,
                                    host_memory=self.device.type == "cuda" and spec.snapshot_memory == "host")
        """Snapshots for rollback and the bytes a rejoining replica receives (any optimizer)."""
        self.completed = 0
        """Optimizer steps taken: the replica holds the state after iterations 0..completed-1."""
        self.checkpoints = None
        if spec.checkpoint_dir:
            from executor.checkpoint import CheckpointWriter, latest_complete, load_stage

            self.checkpoints = CheckpointWriter(spec.checkpoint_dir, self.s, spec.stages)
            newest = latest_complete(spec.checkpoint_dir) if spec.resume else None
            if newest is not None:
                self.completed = load_stage(newest[1], self.s, self.module, self.optimizer)
        self.losses: dict[int, float] = {}
        self.records: dict[int, dict[str, float]] = {}
        """Per finished iteration: wall-clock end, generation and the plan's predicted ms."""
        self.timer = OpTimer(self.device)
        self.keep_snapshots = False
        self._snapshots: dict[int, Any] = {}
        self.before_phase: Callable[[int, str], None] | None = None
        """Fault injection only (executor/fault_points.py): called before each phase's pause point."""
        self.groups: GenerationGroups | None = None
        self.stream: InstructionStream | None = None
        self.predicted_ms = 0.0
        self._pauses: dict[int, str] = {}

    def attach(self, groups: GenerationGroups, stream: InstructionStream, predicted_ms: float = 0.0) -> None:
        if tuple(stream.worker) != self.spec.worker:
            raise ValueError(f"stream is for worker {list(stream.worker)}, not {list(self.spec.worker)}")
        self.groups, self.stream, self.predicted_ms = groups, stream, predicted_ms
        self._pauses = ({} if self.before_phase is None
                        else pause_positions([ins.op for ins in stream.instructions]))

    # ------------------------------------------------------------------------- replica state
    def share_state(self, groups: GenerationGroups, holder: tuple[int, int], completed: int) -> None:
        """Copy `holder`'s parameters and optimizer state, after `completed` steps, to every replica
        of this stage group."""
        data = self.replica.to_bytes() if self.spec.worker == holder else torch.empty(0, dtype=torch.uint8)
        size = torch.tensor([data.numel()], dtype=torch.int64)
        groups.broadcast(size, holder)
        if self.spec.worker != holder:
            data = torch.empty(int(size.item()), dtype=torch.uint8)
        groups.broadcast(data, holder)
        self.replica.load_bytes(data)
        self.runner.drop_in_flight()
        self.completed = completed
        self._release_snapshots(lambda k: True)
        self._keep_snapshot()

    def _release_snapshots(self, stale: Callable[[int], bool]) -> None:
        for k in [k for k in self._snapshots if stale(k)]:
            self.replica.release(self._snapshots.pop(k))

    def _keep_snapshot(self) -> None:
        """Snapshot the state the replica has just reached (after `completed` steps), before any
        of the next iteration's work: the oldest goes first, so its buffers hold the new one (two
        sets at most). On a GPU the copy runs on a side stream during the next iteration."""
        if not self.keep_snapshots:
            return
        self._release_snapshots(lambda k: k <= self.completed - SNAPSHOTS_KEPT or k >= self.completed)
        self._snapshots[self.completed] = self.replica.snapshot()

    def rollback_to(self, iteration: int) -> None:
        """Drop in-flight work and return to the state after `iteration` steps (from the pre-step
        snapshot when this replica had already stepped past it)."""
        self.runner.drop_in_flight()
        if iteration != self.completed:
            snap = self._snapshots.get(iteration)
            if snap is None or iteration > self.completed:
                raise RuntimeError(
                    f"worker {list(self.spec.worker)}: cannot roll back from {self.completed} to "
                    f"{iteration} completed iterations (snapshots kept: {sorted(self._snapshots)})")
            self.replica.restore(snap)
            self.completed = iteration
            self._release_snapshots(lambda k: k > iteration)  # states of the abandoned run
        self._forget_from(iteration)

    def _forget_from(self, iteration: int) -> None:
        for k in [k for k in self.losses if k >= iteration]:
            del self.losses[k]
        for k in [k for k in self.records if k >= iteration]:
            del self.records[k]

    def restore_checkpoint(self, step: int) -> None:
        """Replace this replica's state by checkpoint `step-{step}` of `checkpoint_dir`, or by the
        initial state (the app's seeded stage, a fresh optimizer) for step 0: how every worker
        continues after a stage lost all its replicas and in-memory state cannot be copied."""
        self.runner.drop_in_flight()
        self.replica.settle()
        if step > 0:
            from executor.checkpoint import load_stage

            assert self.spec.checkpoint_dir is not None
            load_stage(Path(self.spec.checkpoint_dir) / f"step-{step}", self.s, self.module, self.optimizer)
        else:
            self._reset_to_initial()
        self.completed = step
        self._release_snapshots(lambda k: True)
        self._keep_snapshot()
        self._forget_from(step)

    def _reset_to_initial(self) -> None:
        fresh = build_stage(self.app, self.s, self.spec.stages)
        blank = self.app.optimizer(fresh.parameters()).state_dict()
        self.module.load_state_dict(fresh.state_dict())
        self.optimizer.load_state_dict(blank)  # an empty `state`: as if it never stepped

    def _step(self, iteration: int) -> None:
        if iteration not in self._snapshots:
            self._keep_snapshot()  # none was taken since the replica reached this state
        self.replica.before_step()
        self.optimizer.step()
        self.completed = iteration + 1
        self._keep_snapshot()
        every = self.spec.checkpoint_every
        # One replica per stage writes: the lowest alive one of this generation.
        writer = self.groups is None or self.groups.stage_members[0] == self.spec.worker
        if self.checkpoints is not None and every > 0 and self.completed % every == 0 and writer:
            self.checkpoints.save(self.completed, self.module, self.optimizer)

    # ------------------------------------------------------------------------------ iteration
    def run_iteration(self, iteration: int) -> None:
        runner, groups, stream = self.runner, self.groups, self.stream
        assert groups is not None and stream is not None, "attach() a generation first"
        if self.completed != iteration:
            raise RuntimeError(f"worker {list(self.spec.worker)} holds {self.completed} steps, asked to run "
                               f"iteration {iteration}")
        runner.start_iteration()

        def post(ins: Instruction, block: bool) -> tuple[torch.Tensor, Any] | None:
            buf = self._receive_buffer(ins.tensor.value, block)
            if buf is None:
                return None  # the sender's signature is not published yet: post when it is needed
            return buf, groups.recv(buf, tuple(ins.peer), ins.tensor.value)

        receives = Receives([ins for ins in stream.instructions if ins.op == "RECV"], post, RECV_WINDOW)
        received: dict[tuple[tuple[int, int], str], torch.Tensor] = {}
        outgoing: dict[tuple[tuple[int, int], str], torch.Tensor] = {}
        sends: list[tuple[Any, torch.Tensor, tuple[int, int]]] = []
        receives.prefetch()
        for position, ins in enumerate(stream.instructions):
            if position in self._pauses:
                self.before_phase(iteration, self._pauses[position])
            started = self.timer.start()
            mb = tuple(ins.microbatch) if ins.microbatch is not None else None
            if ins.op == "RECV":
                buf, work = receives.take(ins)
                groups.wait(work, tuple(ins.peer), f"receive of {ins.tensor.value} {list(mb)}")
                received[(mb, ins.tensor.value)] = self._decode(buf, ins.tensor.value)
                receives.prefetch()
            elif ins.op == "SEND":
                tensor = outgoing.pop((mb, ins.tensor.value))
                peer = tuple(ins.peer)
                sends.append((groups.send(tensor, peer, ins.tensor.value), tensor, peer))
            elif ins.op == "F":
                x = self._load(iteration, mb)[0] if runner.first else received.pop((mb, "activation"))
                targets = self._load(iteration, mb)[1] if runner.last else None
                out = runner.forward(mb, x, targets)
                if not runner.last:
                    outgoing[(mb, "activation")] = self._encode(out, "activation")
            elif ins.op == "B":
                grad = None if runner.last else received.pop((mb, "gradient"))
                grad_in = runner.backward_input(mb, grad)
                if not runner.first:
                    outgoing[(mb, "gradient")] = self._encode(grad_in, "gradient")
            elif ins.op == "W":
                runner.backward_weight(mb)
            elif ins.op == "ALLREDUCE":
                self._allreduce(iteration)
            elif ins.op == "OPTIMIZER":
                self._step(iteration)
            self.timer.stop(ins.op.value, started)
        for work, _, peer in sends:
            groups.wait(work, peer, "send")
        self.timer.flush()  # on CUDA: the iteration's kernels are done before its end is stamped
        if received or outgoing or receives.outstanding:
            raise RuntimeError(
                f"worker {list(self.spec.worker)} iteration {iteration}: stream left "
                f"{len(received)} received and {len(outgoing)} unsent tensors and {receives.outstanding} "
                f"receives never taken (plan inconsistent)"
            )
        if self.completed != iteration + 1:
            raise RuntimeError(f"worker {list(self.spec.worker)}: the stream has no OPTIMIZER step")
        self.records[iteration] = {"end_s": time.time(), "generation": groups.generation,
                                   "predicted_ms": self.predicted_ms}

    # ------------------------------------------------------------- data and the wire format
    def _load(self, iteration: int, mb: tuple[int, int]) -> tuple[Any, Any]:
        """(input, target) of micro-batch (home, index): the same in every process."""
        n = self.spec.pipelines * self.spec.microbatches
        x, y = self.app.microbatch(iteration, mb[0] * self.spec.microbatches + mb[1], n)
        return to_device(x, self.device), to_device(y, self.device)

    def _encode(self, value: Any, kind: str) -> torch.Tensor:
        if kind == "activation" and self.signature_store is not None and not self._published:
            self.signature_store.set(f"signature/{self.s}", encode_signature(self.runner.output_signature))
            self._published = True
        # An empty message (nothing differentiable) still travels: one byte keeps send/recv paired.
        return pack(value) if len(value) else torch.zeros(1, dtype=torch.uint8)

    def _signature(self, kind: str, block: bool) -> list | None:
        """The signature of what arrives: stage s-1's outputs (activation) or the float ones of this
        stage's outputs (gradient); published in the store by the stage that produces them."""
        if kind == "gradient" and self.runner.output_signature is not None:
            return gradient_signature(self.runner.output_signature)
        source = self.s - 1 if kind == "activation" else self.s
        if source not in self._signatures:
            key = f"signature/{source}"
            store = self.signature_store
            if store is None:
                raise RuntimeError("app workers need the c10d store to learn their input signatures")
            deadline = time.monotonic() + self.spec.operation_timeout_s
            while not store.check([key]):
                if not block:
                    return None
                interrupt = self.groups.interrupt if self.groups is not None else None
                if interrupt is not None and interrupt.is_set():
                    raise Interrupted(f"waiting for stage {source}'s output signature")
                if time.monotonic() > deadline:
                    raise TimeoutError(f"stage {source} published no output signature within "
                                       f"{self.spec.operation_timeout_s:.0f} s")
                time.sleep(0.005)
            self._signatures[source] = decode_signature(store.get(key))
        signature = self._signatures[source]
        return signature if kind == "activation" else gradient_signature(signature)

    def _receive_buffer(self, kind: str, block: bool) -> torch.Tensor | None:
        signature = self._signature(kind, block)
        if signature is None:
            return None
        return torch.empty(max(1, nbytes(signature)), dtype=torch.uint8, device=self.device)

    def _decode(self, buffer: torch.Tensor, kind: str) -> Any:
        signature = self._signature(kind, block=True)
        return unpack(buffer, signature) if signature else ()

    def _allreduce(self, iteration: int) -> None:
        self.runner.ensure_grads()
        params = list(self.module.parameters())
        parts = [p.grad.reshape(-1) for p in params]
        if self.runner.last:
            losses = list(self.runner.losses.values())
            # Summed in float64, as the Python floats were before the losses stayed on the device.
            local = (torch.stack([loss.reshape(()) for loss in losses]).double().sum() if losses
                     else torch.zeros((), dtype=torch.float64, device=self.device)) * self.runner.loss_scale
            parts.append(local.reshape(1).to(parts[0].dtype))
        assert self.groups is not None
        if self.groups.stage is None:
            # The stage's only replica: nothing to sum, so no flat copy of every gradient and back.
            if self.runner.last:
                self.losses[iteration] = float(parts[-1])
            return
        flat = torch.cat(parts)
        self.groups.allreduce_sum(flat)
        offset = 0
        for p in params:
            n = p.numel()
            p.grad.copy_(flat[offset : offset + n].view_as(p))
            offset += n
        if self.runner.last:
            self.losses[iteration] = float(flat[-1])

    def results(self) -> dict[str, Any]:
        if self.checkpoints is not None:
            self.checkpoints.flush()
        done = sorted(self.records)
        return {
            "worker": list(self.spec.worker),
            "completed": self.completed,
            "losses": [self.losses[i] for i in sorted(self.losses)],
            "loss_by_iteration": dict(self.losses),
            "iteration_end_s": [self.records[i]["end_s"] for i in done],
            "records": dict(self.records),
            "op_seconds": self.timer.seconds,
            "parameters": {n: p.detach().cpu().clone() for n, p in self.module.named_parameters()},
        }
