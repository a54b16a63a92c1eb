"""The five fault-tolerance strategies, each as a steady-state iteration time under a failure set.

Every strategy is computed from the same job spec (the same per-stage F/B/W/p2p/all-reduce/optimizer
numbers) and, wherever a schedule can be built, with the project's own planner and simulator: the
list-scheduling heuristic plans it and the simulator's replay measures its steady-state period. The
models and their assumptions are written down in docs/evaluation.md; the parameters that cannot be
derived from the job (pauses, checkpoint interval) live in `PauseModel` and are exposed as options.

Throughput is always the full global batch (D x M micro-batches) per iteration time. An iteration
time of None means the strategy cannot train under that failure set without a checkpoint restart.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from planner.failures import normalize
from planner.spec import JobSpec, SpecError, Worker

STRATEGY_NAMES = ("adaptive", "drop", "oobleck", "bamboo", "checkpoint")
STRATEGY_TITLES = {
    "adaptive": "adaptive re-routing (this planner)",
    "drop": "drop failed pipelines",
    "oobleck": "Oobleck-style re-instantiation",
    "bamboo": "Bamboo-style redundancy",
    "checkpoint": "checkpoint-restart onto a spare",
}
VALIDATE_MAX_OPS = 200_000
"""Above this many F/B/W ops the adaptive plan is not re-validated here (it is valid by construction
and tests/planner validate the heuristic); validation of a 4,096-GPU plan costs tens of seconds."""


@dataclass(frozen=True)
class PauseModel:
    """Seconds lost around failure and rejoin events: not derivable from the job spec, so explicit.

    Defaults and their sources are listed in docs/evaluation.md ("Pause parameters").
    """

    detect_s: float = 10.0
    """Every strategy: time until the failure is noticed (collective timeout order)."""
    regroup_s: float = 5.0
    """Adaptive, drop, Oobleck, Bamboo: rebuild communicators without (or with) the worker."""
    oobleck_copy_s: float = 10.0
    """Oobleck only, on top of regroup: copy re-partitioned layers and optimizer state."""
    restart_s: float = 300.0
    """Checkpoint restart (and every strategy's fallback): relaunch and load the checkpoint."""
    checkpoint_interval_s: float = 1800.0
    """Work since the last checkpoint is lost on a restart."""

    def as_json(self) -> dict[str, float]:
        return dict(self.__dict__)


@dataclass
class Outcome:
    """One strategy under one failure set."""

    strategy: str
    iteration_ms: float | None
    detail: str = ""
    approximate: bool = False

    def throughput(self, job: JobSpec) -> float:
        """Micro-batches per second of the full global batch (0 when it cannot train)."""
        if self.iteration_ms is None:
            return 0.0
        return job.pipelines * job.microbatches / (self.iteration_ms / 1000.0)


def job_variant(job: JobSpec, **changes: Any) -> JobSpec:
    """A new, validated job with some fields replaced (never a model_copy: `costs` is cached)."""
    data = job.model_dump(mode="json")
    data.update(changes)
    return JobSpec.parse(data)


@dataclass
class Evaluator:
    """The shared context of all strategies for one job: the job, the pause model and plan caches."""

    job: JobSpec
    pauses: PauseModel = field(default_factory=PauseModel)
    oobleck_min_stages: int | None = None
    """Shortest pipeline Oobleck may build (default ceil(S/2): a GPU holds at most twice its layers)."""
    bamboo_slot: str = "w"
    """Where Bamboo's redundant forward runs: 'w' movable like W (fills bubbles, favourable to
    Bamboo), or 'f' fused into the forward (on the critical path)."""
    baseline_schedule: str = "1f1b"
    """How Oobleck- and Bamboo-style pipelines are scheduled: '1f1b' (their engines' DeepSpeed-style
    1F1B with an unsplit backward) or 'planner' (this project's B/W-split schedule, favourable to
    them). Both keep the staggered per-stage optimizer, which also favours them."""
    _adaptive: dict[str, tuple[float, float]] = field(default_factory=dict)
    _single: dict[tuple, float] = field(default_factory=dict)
    plan_seconds: float = 0.0

    # --------------------------------------------------------------------------- shared simulator

    def single_pipeline_ms(
        self, stage_costs: dict[str, list[float]], microbatches: int, schedule: str = "planner"
    ) -> float:
        """Replayed period of one pipeline with these per-stage costs and micro-batches.

        `schedule` 'planner' is the planner's own fault-free plan; '1f1b' is classic 1F1B with each
        W fused right after its B. All D pipelines of a fault-free job are identical, so this is
        also the fault-free period of any number of such pipelines.
        """
        key = (tuple((k, tuple(v)) for k, v in sorted(stage_costs.items())), microbatches, schedule)
        if key not in self._single:
            from planner.solve import plan

            changes = {k: v for k, v in stage_costs.items()}
            changes.setdefault("memory_limit_mb", self.job.costs.memory_limit_mb)
            single = job_variant(self.job, pipelines=1, stages=len(stage_costs["forward_ms"]),
                                 microbatches=microbatches, **changes)
            if schedule == "1f1b":
                from planner.routing import balanced_routing
                from planner.simulator import replay
                from planner.sweep import SweepPolicy, sweep_schedule

                ops = sweep_schedule(single, balanced_routing(single, ()), SweepPolicy(fused_backward=True))
                self._single[key] = replay(single, ops).iteration_ms
            else:
                self._single[key] = plan(single, (), use_cp=False).iteration_ms
        return self._single[key]

    def base_costs(self) -> dict[str, list[float]]:
        c = self.job.costs
        return {
            "forward_ms": list(c.forward), "backward_input_ms": list(c.backward_input),
            "backward_weight_ms": list(c.backward_weight), "p2p_ms": list(c.p2p),
            "cross_pipeline_p2p_ms": list(c.cross_p2p), "allreduce_ms": list(c.allreduce),
            "optimizer_ms": list(c.optimizer), "activation_mb": list(c.activation),
        }

    def fault_free_ms(self) -> float:
        return self.single_pipeline_ms(self.base_costs(), self.job.microbatches)

    def adaptive_wall_s(self, key: str) -> float:
        """Planning wall time of an adaptive class already planned (0 if it was not)."""
        return self._adaptive.get(key, (0.0, 0.0))[1]

    def outcome(self, strategy: str, failed: tuple[Worker, ...]) -> Outcome:
        try:
            return STRATEGIES[strategy](self, tuple(sorted(set(map(tuple, failed)))))
        except SpecError as exc:  # e.g. a merged or re-partitioned stage no longer fits in memory
            return Outcome(strategy, None, f"cannot train: {exc}")


# ------------------------------------------------------------------------------------ strategies


def adaptive(ev: Evaluator, failed: tuple[Worker, ...]) -> Outcome:
    """This project: the planner's plan for the failure set (cached per canonical class)."""
    import time

    from planner.solve import plan

    try:
        key = normalize(ev.job, failed).key
    except SpecError as exc:
        return Outcome("adaptive", None, f"cannot re-route: {exc}")
    if key not in ev._adaptive:
        started = time.perf_counter()
        result = plan(ev.job, failed, use_cp=False, check=ev.job.op_count <= VALIDATE_MAX_OPS)
        wall = time.perf_counter() - started
        ev.plan_seconds += wall
        ev._adaptive[key] = (result.iteration_ms, wall)
    return Outcome("adaptive", ev._adaptive[key][0], f"class {key}")


def drop_pipelines(ev: Evaluator, failed: tuple[Worker, ...]) -> Outcome:
    """Drop every pipeline with a failed worker; the survivors split the global batch.

    With D' healthy pipelines the busiest gets ceil(D*M / D') micro-batches, and the all-reduce
    makes everyone wait for it: the period is the planner's fault-free plan of that pipeline.
    """
    job = ev.job
    healthy = job.pipelines - len({p for p, _ in failed})
    if healthy == 0:
        return Outcome("drop", None, "no pipeline left without a failure")
    per_pipeline = -(-job.pipelines * job.microbatches // healthy)
    period = ev.single_pipeline_ms(ev.base_costs(), per_pipeline)
    return Outcome("drop", period, f"{healthy} pipelines x {per_pipeline} micro-batches")


def _repartition(costs: dict[str, list[float]], new_stages: int) -> dict[str, list[float]]:
    """Spread the model's layers evenly over `new_stages` GPUs (layers taken as finely divisible).

    Compute, all-reduce, optimizer and activation amounts are integrals of the per-stage values over
    each new stage's share of the model; transfer delays are per hop and keep the largest value.
    """
    old = len(costs["forward_ms"])
    out: dict[str, list[float]] = {}
    for name, values in costs.items():
        if name in ("p2p_ms", "cross_pipeline_p2p_ms"):
            out[name] = [max(values)] * new_stages
            continue
        parts = []
        for j in range(new_stages):
            lo, hi = j * old / new_stages, (j + 1) * old / new_stages
            total = 0.0
            for s in range(math.floor(lo), min(old, math.ceil(hi))):
                total += values[s] * (min(hi, s + 1) - max(lo, s))
            parts.append(total)
        out[name] = parts
    return out


def oobleck(ev: Evaluator, failed: tuple[Worker, ...]) -> Outcome:
    """Re-instantiate each damaged pipeline with its surviving workers as a shorter pipeline.

    A pipeline that lost k workers becomes S-k stages with the layers re-partitioned evenly; one
    shorter than the minimum is dissolved (its workers idle). The global batch is re-divided over
    the pipelines in proportion to their speed: integer micro-batch counts that minimise the
    slowest pipeline's planned period, which is the iteration time (all-reduce waits for it).
    """
    job = ev.job
    S = job.stages
    min_stages = ev.oobleck_min_stages or -(-S // 2)
    lost: dict[int, int] = {}
    for p, _ in failed:
        lost[p] = lost.get(p, 0) + 1
    lengths = [S - lost.get(p, 0) for p in range(job.pipelines)]
    lengths = [n for n in lengths if n >= min_stages]
    if not lengths:
        return Outcome("oobleck", None, f"no pipeline of at least {min_stages} stages left")
    base = ev.base_costs()
    kinds = {n: _repartition(base, n) if n != S else base for n in set(lengths)}
    counts = _divide_batch(ev, kinds, lengths, job.pipelines * job.microbatches)
    period = max(ev.single_pipeline_ms(kinds[n], m, ev.baseline_schedule)
                 for n, m in zip(lengths, counts, strict=True) if m)
    shape = ", ".join(f"{lengths.count(n)}x{n} stages" for n in sorted(set(lengths), reverse=True))
    return Outcome("oobleck", period, f"{shape}; micro-batches {min(counts)}..{max(counts)}")


def _divide_batch(ev: Evaluator, kinds, lengths: list[int], total: int) -> list[int]:
    """Micro-batches per pipeline summing to `total`, minimising the largest planned period.

    Starts from a split proportional to each pipeline kind's planned throughput at M micro-batches,
    then moves one micro-batch at a time from the slowest pipeline to the one that would end
    soonest with it, while that lowers the maximum (every period comes from the planner).
    """
    M = ev.job.microbatches
    sched = ev.baseline_schedule
    rate = {n: M / ev.single_pipeline_ms(kinds[n], M, sched) for n in set(lengths)}
    weight = sum(rate[n] for n in lengths)
    counts = [max(1, int(total * rate[n] / weight)) for n in lengths]
    order = sorted(range(len(lengths)), key=lambda i: -rate[lengths[i]])
    i = 0
    while sum(counts) < total:  # hand out the rounding remainder, fastest kinds first
        counts[order[i % len(order)]] += 1
        i += 1
    while sum(counts) > total:
        j = max(range(len(counts)), key=lambda k: counts[k])
        counts[j] -= 1

    def period(i: int, m: int) -> float:
        return ev.single_pipeline_ms(kinds[lengths[i]], m, sched) if m else 0.0

    for _ in range(4 * len(lengths) + 16):
        slow = max(range(len(counts)), key=lambda k: period(k, counts[k]))
        worst = period(slow, counts[slow])
        fast = min(range(len(counts)), key=lambda k: period(k, counts[k] + 1))
        if fast == slow or period(fast, counts[fast] + 1) >= worst - 1e-9:
            break
        counts[slow] -= 1
        counts[fast] += 1
    return counts


def _bamboo_pipeline(ev: Evaluator, groups: list[list[int]]) -> dict[str, list[float]]:
    """Per-node costs of a Bamboo pipeline whose node i runs the original stages `groups[i]`.

    Each node also runs, redundantly, the forward of the next node's stages (the last node covers
    the first: a ring). With slot 'w' that forward is added to W (movable, fills bubbles); with 'f'
    it is added to F (on the critical path). Transfers keep the largest hop of the merged stages.
    """
    base = ev.base_costs()
    out = {name: [sum(base[name][s] for s in g) for g in groups] for name in base}
    for name in ("p2p_ms", "cross_pipeline_p2p_ms"):
        out[name] = [max(base[name][s] for s in g) for g in groups]
    redundant = [out["forward_ms"][(i + 1) % len(groups)] for i in range(len(groups))]
    if len(groups) > 1:
        slot = "backward_weight_ms" if ev.bamboo_slot == "w" else "forward_ms"
        out[slot] = [v + r for v, r in zip(out[slot], redundant, strict=True)]
    return out


def bamboo(ev: Evaluator, failed: tuple[Worker, ...]) -> Outcome:
    """Redundant computation: fault-free overhead, and a failed node's predecessor runs both stages.

    Pipelines are planned one at a time; the iteration is the slowest pipeline's period. Two failed
    nodes next to each other in one pipeline (ring order) lose both copies of a stage: restart.
    """
    job = ev.job
    S = job.stages
    by_pipeline: dict[int, set[int]] = {}
    for p, s in failed:
        by_pipeline.setdefault(p, set()).add(s)
    shapes = {tuple(): None}
    for p, dead in by_pipeline.items():
        if len(dead) >= S or any((s + 1) % S in dead for s in dead if S > 1):
            return Outcome("bamboo", None, f"pipeline {p} lost adjacent stages: needs a restart")
        shapes[tuple(sorted(dead))] = None
    periods = []
    for dead in shapes:
        # A failed stage goes to its predecessor. Stage 0's predecessor in the ring is the last
        # node; it is modelled on stage 1's node instead so the pipeline stays contiguous (same work).
        groups: list[list[int]] = []
        for s in range(S):
            if s not in dead:
                groups.append(([0] if s == 1 and 0 in dead else []) + [s])
            elif s > 0:
                groups[-1].append(s)
        periods.append(ev.single_pipeline_ms(_bamboo_pipeline(ev, groups), job.microbatches,
                                             ev.baseline_schedule))
    damaged = len(by_pipeline)
    return Outcome("bamboo", max(periods), f"{damaged} pipelines run a merged node")


def checkpoint_restart(ev: Evaluator, failed: tuple[Worker, ...]) -> Outcome:
    """Restart from the last checkpoint with spares in the failed workers' places.

    After the restart the job runs at its fault-free period; its cost is the restart pause and the
    work lost since the last checkpoint, which only the trace (trace.py) can charge.
    """
    return Outcome("checkpoint", ev.fault_free_ms(),
                   f"fault-free after restart on {len(failed)} spares" if failed else "fault-free")


STRATEGIES = {
    "adaptive": adaptive,
    "drop": drop_pipelines,
    "oobleck": oobleck,
    "bamboo": bamboo,
    "checkpoint": checkpoint_restart,
}
