"""`executor.receives.Receives`: receives are posted per peer in the sender's order (`seq`), a few
ahead of need, whatever order the worker consumes them in (hand-worked orders, no processes)."""

from __future__ import annotations

from executor.receives import Receives
from planner.instructions import Instruction


def _recv(mb: int, peer: tuple[int, int], seq: int | None, tensor: str = "activation") -> Instruction:
    return Instruction(op="RECV", microbatch=(0, mb), peer=peer, tensor=tensor, seq=seq)


A, B = (0, 0), (1, 0)


def _receives(recvs, window=2, ready=lambda ins: True):
    posted: list[tuple] = []

    def post(ins, block):
        if not block and not ready(ins):
            return None
        posted.append((ins.peer, ins.microbatch[1]))
        return f"handle-{ins.microbatch[1]}"

    return Receives(recvs, post, window), posted


def test_a_peers_receives_are_posted_in_its_send_order_not_in_the_order_they_are_needed():
    # Needed: 2, 0, 1 from A; A sends 0, 1, 2 (seq); and 5 from B in between.
    recvs = [_recv(2, A, 2), _recv(5, B, 0), _recv(0, A, 0), _recv(1, A, 1)]
    receives, posted = _receives(recvs, window=2)
    receives.prefetch()
    # Micro-batch 2 needs A's first two messages posted before it: three outstanding, beyond the
    # window of 2, because nothing else can receive A's earlier messages.
    assert posted == [(A, 0), (A, 1), (A, 2)]
    assert receives.take(recvs[0]) == "handle-2"
    receives.prefetch()  # 2 still wait (0 and 1): the window is full, B's is not posted yet
    assert posted == [(A, 0), (A, 1), (A, 2)]
    assert receives.take(recvs[1]) == "handle-5"  # posted when needed
    assert posted[-1] == (B, 5)
    assert receives.take(recvs[2]) == "handle-0" and receives.take(recvs[3]) == "handle-1"
    assert receives.outstanding == 0


def test_without_seq_a_stream_keeps_its_own_order():
    recvs = [_recv(2, A, None), _recv(0, A, None)]
    receives, posted = _receives(recvs, window=4)
    receives.prefetch()
    assert posted == [(A, 2), (A, 0)]


def test_prefetch_stops_at_a_receive_whose_buffer_cannot_be_made_yet():
    recvs = [_recv(0, A, 0, "gradient"), _recv(1, A, 1, "gradient")]
    receives, posted = _receives(recvs, window=4, ready=lambda ins: False)
    receives.prefetch()
    assert posted == []
    assert receives.take(recvs[1]) == "handle-1"  # blocking: posts 0 first, in the sender's order
    assert posted == [(A, 0), (A, 1)] and receives.outstanding == 1
