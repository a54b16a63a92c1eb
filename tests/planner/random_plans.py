"""Random valid plans and an independent period computation, for falsification tests.

Nothing here uses the planner's schedulers or its simulator:
- `random_plan` builds a plan by random list scheduling: random routing (any alive same-stage peer,
  rule 1), then one op at a time, a random worker places a random op whose inputs are already placed,
  as early as rules 3, 4 and 6 allow (memory counted exactly as rule 6 says, with `activation_w_mb`
  after B). The validator must accept every plan it returns (the tests assert so).
- `channel_orders` reads, per sender-receiver channel, the order of SENDs and RECVs from the two
  ends' instruction streams (what a transport that matches messages by order must reconcile).
- `max_cycle_mean` computes a plan's steady-state period as the largest cycle mean of the
  worker-to-worker max-plus matrix (Karp's algorithm), from a plain longest-path sweep of one
  iteration: a second method beside the simulator's iterated replay.
"""

from __future__ import annotations

import random
from collections import defaultdict

from planner.spec import JobSpec, Worker
from planner.timeline import Op


def random_plan(job: JobSpec, failed: list[Worker], rng: random.Random, stay_home: float = 0.6,
                w_late: float = 0.5) -> list[Op] | None:
    """A random valid plan, or None when the random choices stall (memory full everywhere)."""
    c = job.costs
    D, S, M = job.pipelines, job.stages, job.microbatches
    dead = set(map(tuple, failed))
    alive = {s: [p for p in range(D) if (p, s) not in dead] for s in range(S)}
    route = {}
    for p in range(D):
        for m in range(M):
            for s in range(S):
                home_ok = (p, s) not in dead and rng.random() < stay_home
                route[(p, m, s)] = p if home_ok else rng.choice(alive[s])
    todo: dict[Worker, list[tuple[str, int, int]]] = defaultdict(list)
    for (p, m, s), q in route.items():
        for kind in "FBW":
            todo[(q, s)].append((kind, p, m))
    end: dict[tuple[str, int, int, int], float] = {}
    free = defaultdict(float)
    held = defaultdict(float)
    ops: list[Op] = []

    def ready_at(kind: str, p: int, m: int, s: int, q: int) -> float | None:
        if kind == "F":
            if s == 0:
                return 0.0
            prev = end.get(("F", p, m, s - 1))
            return None if prev is None else prev + c.hop_ms(s - 1, route[(p, m, s - 1)] != q)
        if kind == "B":
            if s == S - 1:
                return end.get(("F", p, m, s))
            nxt = end.get(("B", p, m, s + 1))
            return None if nxt is None else nxt + c.hop_ms(s, route[(p, m, s + 1)] != q)
        return end.get(("B", p, m, s))

    while any(todo.values()):
        choices = []
        for (q, s), left in todo.items():
            for i, (kind, p, m) in enumerate(left):
                at = ready_at(kind, p, m, s, q)
                if at is None:
                    continue
                if kind == "F" and held[(q, s)] + c.activation[s] > c.memory_limit_mb + 1e-9:
                    continue
                choices.append(((q, s), i, at))
        if not choices:
            return None
        ws = [ch for ch in choices if todo[ch[0]][ch[1]][0] == "W"]
        pick = rng.choice(ws if ws and rng.random() > w_late else choices)
        w, i, at = pick
        kind, p, m = todo[w].pop(i)
        q, s = w
        start = max(free[w], at)
        stop = start + c.duration(kind, s)
        free[w] = stop
        end[(kind, p, m, s)] = stop
        if kind == "F":
            held[w] += c.activation[s]
        elif kind == "B":
            held[w] -= c.activation[s] - c.activation_w[s]
        else:
            held[w] -= c.activation_w[s]
        ops.append(Op(w, kind, (p, m), start, stop))
    for s in range(S):
        at = max(free[(q, s)] for q in alive[s])
        for q in alive[s]:
            ar_end = at + c.allreduce[s]
            ops.append(Op((q, s), "ALLREDUCE", None, at, ar_end))
            ops.append(Op((q, s), "OPTIMIZER", None, ar_end, ar_end + c.optimizer[s]))
    return ops


def _longest_from(job: JobSpec, ops: list[Op], source: Worker) -> dict[Worker, float]:
    """For one iteration with `source` ready at 0 and every other worker at -inf: each worker's
    OPTIMIZER end (the longest path from source's first op start through rules 3-5 and worker order)."""
    c = job.costs
    S = job.stages
    orders: dict[Worker, list[Op]] = defaultdict(list)
    for op in ops:
        orders[op.worker].append(op)
    for seq in orders.values():
        seq.sort(key=lambda o: (o.start_ms, o.end_ms, o.kind in ("ALLREDUCE", "OPTIMIZER"),
                                o.kind == "OPTIMIZER"))
    place = {(o.kind, o.microbatch[0], o.microbatch[1], o.worker[1]): o.worker
             for o in ops if o.microbatch is not None}
    neg = float("-inf")
    fin: dict[tuple, float] = {}
    pos = dict.fromkeys(orders, 0)
    last = dict.fromkeys(orders, neg)
    reached_ar: dict[Worker, float] = {}  # each worker's last end before its ALLREDUCE
    progress = True
    while progress:
        progress = False
        for w, seq in orders.items():
            while pos[w] < len(seq):
                op = seq[pos[w]]
                s = w[1]
                t = 0.0 if (w == source and pos[w] == 0) else neg
                t = max(t, last[w])
                if op.microbatch is not None:
                    p, m = op.microbatch
                    if op.kind == "F" and s > 0:
                        key = ("F", p, m, s - 1)
                    elif op.kind == "B" and s < S - 1:
                        key = ("B", p, m, s + 1)
                    elif op.kind == "B":
                        key = ("F", p, m, s)
                    elif op.kind == "W":
                        key = ("B", p, m, s)
                    else:
                        key = None
                    if key is not None:
                        if key not in fin:
                            break
                        hop = 0.0
                        if op.kind in "FB" and key[3] != s:
                            hop = c.hop_ms(min(s, key[3]), place[key][0] != w[0])
                        t = max(t, fin[key] + hop)
                    fin[(op.kind, p, m, s)] = t + (op.end_ms - op.start_ms)
                    last[w] = fin[(op.kind, p, m, s)]
                elif op.kind == "ALLREDUCE":
                    stage_ws = [v for v in orders if v[1] == s]
                    if any(pos[v] < len(orders[v]) and orders[v][pos[v]].kind != "ALLREDUCE"
                           for v in stage_ws):
                        break  # every worker of the stage must have reached its all-reduce
                    for v in stage_ws:
                        reached_ar.setdefault(v, last[v])
                    last[w] = max(reached_ar[v] for v in stage_ws) + (op.end_ms - op.start_ms)
                else:
                    last[w] += op.end_ms - op.start_ms
                pos[w] += 1
                progress = True
    if any(pos[w] < len(seq) for w, seq in orders.items()):
        raise ValueError("deadlock")
    return last


def max_cycle_mean(job: JobSpec, ops: list[Op]) -> float:
    """The contract's replay period as the max-plus eigenvalue of the worker matrix A, where
    A[j][i] is the longest path from worker i's iteration start to worker j's OPTIMIZER end."""
    workers = sorted({op.worker for op in ops})
    n = len(workers)
    index = {w: k for k, w in enumerate(workers)}
    neg = float("-inf")
    A = [[neg] * n for _ in range(n)]
    for i, w in enumerate(workers):
        for v, t in _longest_from(job, ops, w).items():
            A[index[v]][i] = t
    # Karp: D_k(v) = longest walk of exactly k edges ending at v (from any start, weight 0).
    Dk = [[0.0] * n]
    for _ in range(n):
        prev = Dk[-1]
        Dk.append([max((prev[i] + A[j][i] for i in range(n) if A[j][i] > neg and prev[i] > neg),
                       default=neg) for j in range(n)])
    best = neg
    for v in range(n):
        if Dk[n][v] == neg:
            continue
        worst = min((Dk[n][v] - Dk[k][v]) / (n - k) for k in range(n) if Dk[k][v] > neg)
        best = max(best, worst)
    return best


def channel_orders(job: JobSpec, failed, ops) -> tuple[dict, dict]:
    """Per channel (sender, receiver, tensor kind), from both ends' instruction streams: the
    micro-batches in the order the sender's stream sends them, and the receiver's RECV
    instructions in the order its stream needs them."""
    from planner.instructions import instruction_stream

    failed = tuple(map(tuple, failed))
    sent: dict = {}
    received: dict = {}
    for w in [(p, s) for p in range(job.pipelines) for s in range(job.stages) if (p, s) not in set(failed)]:
        for ins in instruction_stream(job, failed, ops, w).instructions:
            if ins.op == "SEND":
                sent.setdefault((w, ins.peer, ins.tensor), []).append(ins.microbatch)
            elif ins.op == "RECV":
                received.setdefault((ins.peer, w, ins.tensor), []).append(ins)
    return sent, received

