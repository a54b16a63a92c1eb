"""Process groups per membership generation, and how P2P traffic is matched.

Groups are never made with `init_process_group`: each generation gets its own `PrefixStore`
(`gen{n}/p2p` for the one global group, `gen{n}/stage{s}` for each stage's all-reduce group) on a
`TCPStore` hosted by a process that outlives the workers, and the backend is constructed directly.
That lets survivors build generation n+1 among themselves without restarting, and keeps the only
device-dependent line (gloo on CPU, NCCL on GPU) in `make_group`.

Point-to-point messages are matched by order within each pair of workers, as NCCL matches them
(it ignores tags): the receiver posts in the sender's order (`executor/receives.py`). On a GPU
gradients travel in a P2P group of their own (`GenerationGroups.p2p_back`): NCCL runs a pair's
sends and receives on one stream in the order they were issued, so a worker that queues an
activation send to a peer before a gradient receive from it, while the peer queues its gradient
send before that activation's receive (1F1B does exactly this), would block both for good once the
tensors pass NCCL's eager limit.
"""

from __future__ import annotations

import datetime
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
import torch.distributed as dist

Worker = tuple[int, int]
T = TypeVar("T")

TENSOR_KINDS = ("activation", "gradient")
"""What P2P carries; each kind is its own channel (tag, and on a GPU its own group)."""

POLL_S = 0.05
"""How often a blocked worker looks at the generation event (well below the 2 s detection bar)."""


class Interrupted(Exception):
    """A newer membership generation is settled: drop in-flight work and move to it."""


class PeerLost(RuntimeError):
    """A send, receive or all-reduce failed (a broken connection): `peer` is the worker on the other
    end when the operation had one (P2P), None for a collective."""

    def __init__(self, message: str, peer: Worker | None):
        super().__init__(message)
        self.peer = peer


def interruptible(fn: Callable[[], T], interrupt: threading.Event | None, what: str) -> T:
    """Run a blocking call, but give up as soon as `interrupt` is set.

    gloo offers no way to cancel a posted receive (`abort()` does not wake it, and a `wait` with a
    timeout poisons every pair of the group), so the blocking call runs on a helper thread and the
    caller polls the event. An abandoned call stays blocked until its peer's connection closes or
    the group's own timeout: the group is never reused, and workers leave with `os._exit`.
    """
    if interrupt is None:
        return fn()
    done = threading.Event()
    box: dict[str, object] = {}

    def run() -> None:
        try:
            box["value"] = fn()
        except BaseException as exc:  # handed to the caller's thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=run, name=f"wait:{what}", daemon=True).start()
    while not done.wait(POLL_S):
        if interrupt.is_set():
            raise Interrupted(what)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    return box["value"]  # type: ignore[return-value]



@dataclass(frozen=True)
class Timeouts:
    """The timeout hierarchy (seconds); each must be below the next.

    operation: one receive, send or all-reduce; group_setup: building a generation's groups (longer,
    because a survivor may still be stuck in the old generation's operation when the others start).
    """

    operation_s: float = 60.0
    group_setup_s: float = 120.0

    def __post_init__(self) -> None:
        if not 0 < self.operation_s < self.group_setup_s:
            raise ValueError(
                f"timeouts: need 0 < operation_s ({self.operation_s}) < group_setup_s ({self.group_setup_s})"
            )


def torch_device(device: str, local_index: int = 0) -> torch.device:
    if device == "cpu":
        return torch.device("cpu")
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("device: cuda was asked for but torch sees no CUDA device")
        return torch.device("cuda", local_index % torch.cuda.device_count())
    raise ValueError(f"device: must be 'cpu' or 'cuda', got {device!r}")


def make_group(store: dist.Store, rank: int, size: int, timeout_s: float, device: str,
               bind_host: str | None = None) -> dist.ProcessGroup:
    """The backend for one group: gloo on CPU, NCCL on GPU (the one device switch). `bind_host`:
    the address gloo listens on and advertises (this node's address; default: the host name's)."""
    timeout = datetime.timedelta(seconds=timeout_s)
    if device == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, size, opts)
    if bind_host:
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=bind_host)]
        return dist.ProcessGroupGloo(store, rank, size, opts)
    return dist.ProcessGroupGloo(store, rank, size, timeout)


def connect_store(host: str, port: int, timeout_s: float) -> dist.TCPStore:
    return dist.TCPStore(host, port, is_master=False, timeout=datetime.timedelta(seconds=timeout_s))


class GenerationGroups:
    """The groups of one membership generation, as seen by one worker."""

    def __init__(
        self, store: dist.Store, generation: int, alive: list[Worker], worker: Worker,
        timeouts: Timeouts, device: str, interrupt: threading.Event | None = None,
        bind_host: str | None = None, gradient_group: bool | None = None,
    ):
        if worker not in alive:
            raise ValueError(f"worker {list(worker)} is not in generation {generation}'s alive set")
        self.generation = generation
        self.interrupt = interrupt
        self.alive = sorted(alive)
        self.rank_of = {w: i for i, w in enumerate(self.alive)}
        prefix = dist.PrefixStore(f"gen{generation}", store)
        self.p2p: dist.ProcessGroup | None = None
        self.p2p_back: dist.ProcessGroup | None = None
        """Gradients' group: its own on a GPU (see the module's docstring), else `p2p`."""
        if len(self.alive) > 1:
            self.p2p = make_group(
                dist.PrefixStore("p2p", prefix), self.rank_of[worker], len(self.alive),
                timeouts.group_setup_s, device, bind_host,
            )
            own_group = device == "cuda" if gradient_group is None else gradient_group
            self.p2p_back = self.p2p if not own_group else make_group(
                dist.PrefixStore("p2p-back", prefix), self.rank_of[worker], len(self.alive),
                timeouts.group_setup_s, device, bind_host,
            )
        self.operation_timeout = datetime.timedelta(seconds=timeouts.operation_s)
        self.stage_members = [w for w in self.alive if w[1] == worker[1]]
        self.stage: dist.ProcessGroup | None = None
        if len(self.stage_members) > 1:
            self.stage = make_group(
                dist.PrefixStore(f"stage{worker[1]}", prefix), self.stage_members.index(worker),
                len(self.stage_members), timeouts.group_setup_s, device, bind_host,
            )

    def _channel(self, kind: str) -> tuple[dist.ProcessGroup, int]:
        """The group and tag of one kind of tensor: matched by order within it, never by tag."""
        group = self.p2p if kind == "activation" else self.p2p_back
        assert group is not None
        return group, TENSOR_KINDS.index(kind)

    def send(self, tensor: torch.Tensor, peer: Worker, kind: str) -> dist.Work:
        group, tag = self._channel(kind)
        return self._post(lambda: group.send([tensor], self.rank_of[peer], tag), peer, "send")

    def recv(self, tensor: torch.Tensor, peer: Worker, kind: str) -> dist.Work:
        group, tag = self._channel(kind)
        return self._post(lambda: group.recv([tensor], self.rank_of[peer], tag), peer, "receive")

    def _post(self, fn: Callable[[], dist.Work], peer: Worker | None, what: str) -> dist.Work:
        """Posting an operation can fail at once (gloo raises when the pair's connection is already
        closed): that is the same lost peer as a failed wait, not a crash of this worker."""
        try:
            return fn()
        except RuntimeError as exc:
            who = f" with {list(peer)}" if peer is not None else ""
            raise PeerLost(f"{what}{who} failed in generation {self.generation}: {exc}", peer) from exc

    def wait(self, work: dist.Work, peer: Worker | None = None, what: str = "operation") -> None:
        """Every wait is bounded by the operation timeout (raises instead of hanging), and with an
        `interrupt` event it ends within `POLL_S` of a newer generation. A failed operation is a
        `PeerLost` naming the peer when there is one."""
        try:
            interruptible(lambda: work.wait(self.operation_timeout), self.interrupt, what)
        except (Interrupted, PeerLost):
            raise
        except RuntimeError as exc:
            who = f" with {list(peer)}" if peer is not None else ""
            raise PeerLost(f"{what}{who} failed in generation {self.generation}: {exc}", peer) from exc

    def allreduce_sum(self, flat: torch.Tensor) -> None:
        if self.stage is not None:
            what = f"stage {self.stage_members[0][1]} all-reduce"
            self.wait(self._post(lambda: self.stage.allreduce([flat]), None, what), what=what)

    def broadcast(self, flat: torch.Tensor, root: Worker) -> None:
        """Copy `flat` from `root` to every member of this worker's stage group."""
        if self.stage is not None:
            opts = dist.BroadcastOptions()
            opts.rootRank = self.stage_members.index(root)
            what = "stage state broadcast"
            self.wait(self._post(lambda: self.stage.broadcast([flat], opts), root, what), what=what)
