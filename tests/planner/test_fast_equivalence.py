"""The speed-ups of issue 8's 3 s bar change no result: each faster function against a frozen copy of
the code it replaced (tests/planner/reference/), on random inputs; the validator's array check
against its own per-op checks, which it only puts in front of.

Identity, not closeness: every report field is compared with `==` (floats included), because the
planner keeps the first candidate whose period is strictly lower, so a last-bit difference in a
period could change which plan is written (`benchmarks/plan_hashes.py` checks the plans themselves).
"""

from __future__ import annotations

import random
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner import simulator
from planner.spec import JobSpec
from planner.timeline import Op
from tests.planner.random_plans import random_plan
from tests.planner.reference import simulator_36aee87 as reference_simulator

FAST = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow])

times = st.one_of(st.integers(1, 6).map(float), st.floats(0.3, 7.0).map(lambda x: round(x, 3)))


@st.composite
def plans(draw, max_d=3, max_s=3, max_m=4):
    """A random job (whole-ms times: many ties in start times, or fractional), failures, and a
    random valid plan of it from the planner-independent random list scheduler."""
    D, S, M = draw(st.integers(1, max_d)), draw(st.integers(1, max_s)), draw(st.integers(1, max_m))
    per = st.one_of(times, st.lists(times, min_size=S, max_size=S))
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": draw(per),
            "backward_input_ms": draw(per), "backward_weight_ms": draw(per),
            "p2p_ms": draw(st.sampled_from([0.0, 0.5, 1.0])),
            "cross_pipeline_p2p_ms": draw(st.sampled_from([0.0, 0.7, 2.0])),
            "allreduce_ms": draw(st.integers(0, 6).map(float)),
            "optimizer_ms": draw(st.integers(0, 2).map(float)),
            "activation_mb": 2.0, "activation_w_mb": draw(st.sampled_from([0.0, 1.0, 2.0])),
            "memory_limit_mb": draw(st.sampled_from([2.0, 4.0, 8.0]))}
    job = JobSpec.parse(spec)
    failed = []
    if D > 1:
        for s in range(S):
            failed += [(p, s) for p in sorted(draw(st.sets(st.integers(0, D - 1), max_size=D - 1)))]
    rng = random.Random(draw(st.integers(0, 2**31)))
    for _ in range(20):
        ops = random_plan(job, failed, rng, stay_home=rng.random(), w_late=rng.random())
        if ops is not None:
            return job, ops, rng
    return job, None, rng


@contextmanager
def evaluated(by: str):
    """The replay's graph walked with numpy level by level ("numpy") or in plain Python node by
    node and edge by edge ("python"), whatever the graph's width would pick."""
    saved = simulator.NUMPY_LEVELS_MIN_CHAINS, simulator.NUMPY_ITERATION_MIN_EDGES_PER_LEVEL
    threshold = 0 if by == "numpy" else 10**12
    simulator.NUMPY_LEVELS_MIN_CHAINS = simulator.NUMPY_ITERATION_MIN_EDGES_PER_LEVEL = threshold
    try:
        yield
    finally:
        simulator.NUMPY_LEVELS_MIN_CHAINS, simulator.NUMPY_ITERATION_MIN_EDGES_PER_LEVEL = saved


def same_replay(job: JobSpec, ops: list[Op]) -> None:
    """Both replays raise the same error, or return equal reports field for field, with the graph
    walked either way."""
    try:
        want = reference_simulator.replay(job, ops)
    except reference_simulator.ReplayError as exc:
        for by in ("numpy", "python"):
            with evaluated(by), pytest.raises(simulator.ReplayError, match=str(exc)):
                simulator.replay(job, ops)
        return
    for by in ("numpy", "python"):
        with evaluated(by):
            got = simulator.replay(job, ops)
        assert got.__dict__ == want.__dict__, by
        assert list(got.busy_ms) == list(want.busy_ms)  # same worker order too


@FAST
@given(plans())
def test_replay_equals_reference_on_random_plans(case):
    job, ops, rng = case
    if ops is None:
        return
    same_replay(job, ops)
    # Ties in (start, end) are broken by input order: the shuffled list must agree too.
    shuffled = ops[:]
    rng.shuffle(shuffled)
    same_replay(job, shuffled)


@FAST
@given(plans())
def test_replay_equals_reference_on_reordered_plans(case):
    """Orders the scheduler never writes (start times swapped between two ops of a worker): some
    deadlock, and both replays must say so with the same error; others replay to equal reports."""
    job, ops, rng = case
    if ops is None or len(ops) < 2:
        return
    for _ in range(3):
        a, b = rng.sample(range(len(ops)), 2)
        changed = ops[:]
        x, y = changed[a], changed[b]
        changed[a] = Op(x.worker, x.kind, x.microbatch, y.start_ms, y.start_ms + (x.end_ms - x.start_ms))
        changed[b] = Op(y.worker, y.kind, y.microbatch, x.start_ms, x.start_ms + (y.end_ms - y.start_ms))
        same_replay(job, changed)


def test_replay_equals_reference_on_planner_plans(small_job):
    from planner.solve import plan

    for failed in ([], [(0, 0)], [(1, 2), (2, 2)]):
        ops = list(plan(small_job, failed, use_cp=False).ops)
        same_replay(small_job, ops)
        same_replay(small_job, ops[::-1])


@FAST
@given(st.integers(1, 40), st.integers(0, 120), st.integers(0, 2**31))
def test_levels_equal_reference(nodes, edges, seed):
    """Longest-path depths of random DAGs (edges from lower to higher node ids, repeats allowed),
    and a cycle raises in both."""
    import numpy as np

    rng = np.random.default_rng(seed)
    a = rng.integers(0, nodes, edges)
    b = rng.integers(0, nodes, edges)
    src, dst = np.minimum(a, b), np.maximum(a, b)
    keep = src != dst
    src, dst = src[keep], dst[keep]
    perm = rng.permutation(nodes)  # node ids not in topological order
    src, dst = perm[src], perm[dst]
    want = reference_simulator._levels(nodes, src, dst).tolist()
    # Both ways of running the rounds: numpy frontiers (wide graphs) and one node at a time.
    for chains in (1, simulator.NUMPY_LEVELS_MIN_CHAINS):
        assert simulator._levels(nodes, src, dst, chains).tolist() == want
    if src.size:
        cyc_src, cyc_dst = np.r_[src, dst[:1]], np.r_[dst, src[:1]]
        for chains in (1, simulator.NUMPY_LEVELS_MIN_CHAINS):
            with pytest.raises(simulator.ReplayError):
                simulator._levels(nodes, cyc_src, cyc_dst, chains)
        with pytest.raises(reference_simulator.ReplayError):
            reference_simulator._levels(nodes, cyc_src, cyc_dst)


@FAST
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.sampled_from(list(simulator._KIND_CODE)),
                          st.integers(0, 3), st.integers(0, 1)), max_size=40))
def test_worker_order_equals_timeline_worker_orders(rows):
    """The replay's one-lexsort op order is `timeline.worker_orders`' (per worker by start, end,
    kind rank, then input order), on op lists full of ties (zero-length ops included)."""
    from planner.timeline import worker_orders

    ops = [Op((p, s), kind, None if kind in ("ALLREDUCE", "OPTIMIZER") else (0, 0), float(t), float(t + d))
           for p, s, kind, t, d in rows]
    orders = worker_orders(ops)
    want = [op for w in sorted(orders) for op in orders[w]]
    kind, pipe, stage, _, start, end = simulator._columns(ops, 1)
    got = [ops[i] for i in simulator._worker_order(kind, pipe, stage, start, end)]
    assert [id(op) for op in got] == [id(op) for op in want]


@st.composite
def sweeps(draw):
    """A random job, failures, a routing (balanced / dissolving / mixed / random peers), a sweep
    policy, and maybe orders: the 1F1B orders with some workers' sequences shuffled (often
    deadlocking: the stall check must then agree with the loop) or a random valid plan's orders."""
    from planner.routing import Routing, balanced_routing, mixed_routing
    from planner.sweep import SweepPolicy, _worker_orders
    from planner.timeline import orders_of

    D, S, M = draw(st.integers(1, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 5))
    per = st.one_of(times, st.lists(times, min_size=S, max_size=S))
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": draw(per),
            "backward_input_ms": draw(per), "backward_weight_ms": draw(per),
            "p2p_ms": draw(st.sampled_from([0.0, 0.5, 1.0])),
            "cross_pipeline_p2p_ms": draw(st.sampled_from([0.0, 0.7, 2.0])),
            "allreduce_ms": 3.0, "optimizer_ms": 1.0,
            "activation_mb": 2.0, "activation_w_mb": draw(st.sampled_from([0.0, 1.0, 2.0])),
            "memory_limit_mb": draw(st.sampled_from([2.0, 4.0, 8.0, None]))}
    job = JobSpec.parse(spec)
    failed = []
    if D > 1:
        for s in range(S):
            failed += [(p, s) for p in sorted(draw(st.sets(st.integers(0, D - 1), max_size=D - 1)))]
    failed = tuple(sorted(failed))
    rng = random.Random(draw(st.integers(0, 2**31)))
    how = draw(st.sampled_from(["balanced", "mixed", "random"]))
    routing = None
    if how == "mixed":
        routing = mixed_routing(job, failed, draw(st.integers(0, M)))
    elif how == "random":
        dead = set(failed)
        moved = {}
        for home in range(D):
            for m in range(M):
                for s in range(S):
                    if (home, s) in dead or rng.random() < 0.3:
                        moved[(home, m, s)] = rng.choice([p for p in range(D) if (p, s) not in dead])
        routing = Routing(job, failed, moved)
    if routing is None:
        routing = balanced_routing(job, failed, draw(st.integers(0, 2)))
    policy = SweepPolicy(warmup_slack=draw(st.integers(-1, 2)), w_overrun=draw(st.sampled_from([0.0, 0.5])),
                         fused_backward=draw(st.booleans()))
    orders = None
    mode = draw(st.sampled_from(["own", "shuffled", "plan"]))
    if mode == "shuffled":
        orders = _worker_orders(job, routing, policy)
        for w in list(orders):
            if rng.random() < 0.5:
                orders[w] = rng.sample(orders[w], len(orders[w]))
    elif mode == "plan":
        ops = random_plan(job, list(failed), rng)
        orders = None if ops is None else orders_of(ops)
    return job, routing, policy, orders


@settings(max_examples=150, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(sweeps(), st.sampled_from([1, 2, 5, 10**9]))
def test_sweep_equals_reference(case, check_after):
    """The sweep (with its array stall check, asked after `check_after` placed ops: these jobs are
    smaller than the default) writes the reference's schedule op for op, or None exactly when the
    reference does (a stall, or memory the warm-up cannot get)."""
    from planner import sweep
    from tests.planner.reference import sweep_36aee87 as reference_sweep

    job, routing, policy, orders = case
    want = reference_sweep.sweep_schedule(job, routing, policy, orders)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(sweep, "STALL_CHECK_AFTER", check_after)
        got = sweep.sweep_schedule(job, routing, policy, orders)
    assert got == want


def test_stall_check_sees_cycles_and_missing_inputs():
    """Direct cases for `_stalls`: one worker, two stages; B before its own F deadlocks; an input
    that no worker runs stalls; the plain order does not."""
    from planner.precedence import needs
    from planner.sweep import _stalls

    job = JobSpec.parse({"pipelines": 1, "stages": 2, "microbatches": 1, "forward_ms": 1.0,
                         "backward_input_ms": 1.0, "backward_weight_ms": 1.0, "allreduce_ms": 1.0,
                         "p2p_ms": 0.5, "activation_mb": 1.0, "optimizer_ms": 1.0})
    rule3 = needs(job.costs, 2)
    fine = {0: [("F", 0), ("B", 0)], 1: [("F", 0), ("B", 0)]}
    assert not _stalls(fine, 2, 1, rule3)
    assert _stalls({0: [("B", 0), ("F", 0)], 1: [("F", 0), ("B", 0)]}, 2, 1, rule3)
    assert _stalls({0: [("F", 0), ("B", 0)], 1: [("B", 0)]}, 2, 1, rule3)  # B at the last stage lacks its F


# ------------------------------------------------------------------ candidates ruled out by a bound


@FAST
@given(plans(max_d=3, max_s=3, max_m=4))
def test_bound_with_a_plans_own_loads_is_not_beaten(case):
    """`lower_bound(busiest=...)` with a plan's own per-stage busiest load is a bound for that
    plan: falsified by no random valid plan (the rule that lets the search skip a routing)."""
    from planner.bounds import lower_bound

    job, ops, _ = case
    if ops is None:
        return
    loads: dict[tuple[int, int], int] = {}
    for op in ops:
        if op.kind == "F":
            loads[op.worker] = loads.get(op.worker, 0) + 1
    busiest = [max([n for (_, s), n in loads.items() if s == stage], default=0)
               for stage in range(job.stages)]
    report = simulator.replay(job, ops)
    bound = lower_bound(job, [], busiest=busiest).value_ms
    assert report.iteration_ms >= bound - 1e-6 * max(1.0, bound), (report.iteration_ms, bound, busiest)


@st.composite
def searches(draw):
    D, S, M = draw(st.integers(2, 4)), draw(st.integers(1, 4)), draw(st.integers(1, 6))
    per = st.one_of(times, st.lists(times, min_size=S, max_size=S))
    spec = {"pipelines": D, "stages": S, "microbatches": M, "forward_ms": draw(per),
            "backward_input_ms": draw(per), "backward_weight_ms": draw(per),
            "p2p_ms": draw(st.sampled_from([0.0, 0.5])),
            "cross_pipeline_p2p_ms": draw(st.sampled_from([0.5, 2.0])),
            "allreduce_ms": 3.0, "optimizer_ms": 1.0, "activation_mb": 1.0,
            "memory_limit_mb": draw(st.sampled_from([None, 2.0, 3.0, 8.0]))}
    job = JobSpec.parse(spec)
    workers = [(p, s) for p in range(D) for s in range(S)]
    failed = draw(st.lists(st.sampled_from(workers), min_size=1, max_size=3, unique=True))
    if any(all((p, s) in failed for p in range(D)) for s in range(S)):
        failed = failed[:1]
    return job, tuple(sorted(failed)), draw(st.booleans())


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(searches())
def test_skipping_beaten_candidates_changes_no_result(case):
    """The search with the bound rule (`candidates._beaten`) returns the same ops, period and
    winner as without it (every candidate built and replayed), on the small-job path and on the
    large-job path (forced by lowering HEURISTIC_GRID_MAX_OPS: there the list schedule is made
    before the dissolve sweep)."""
    from planner import candidates
    from planner.fault_free import fault_free_plan

    job, failed, big = case
    template = list(fault_free_plan(job).ops)
    with pytest.MonkeyPatch.context() as patch:
        if big:
            patch.setattr(candidates, "HEURISTIC_GRID_MAX_OPS", 0)
        fast = candidates.best_heuristic(job, failed, 0.0, template=template)
        patch.setattr(candidates, "_beaten", lambda *args, **kwargs: False)
        full = candidates.best_heuristic(job, failed, 0.0, template=template)
    assert fast[1:] == full[1:]
    assert fast[0] == full[0]


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(searches())
def test_routing_bound_is_the_bound_with_the_routings_loads(case):
    """`routing_bound` (the failure set's bound with only bounds 1-3 redone for a routing's loads)
    is exactly `lower_bound(busiest=loads)` for every candidate routing the search checks."""
    from planner.bounds import lower_bound, routing_bound
    from planner.routing import balanced_routing, dissolving_routing, lane_routing, mixed_routing

    job, failed, _ = case
    failure_bound = lower_bound(job, failed).value_ms
    M = job.microbatches
    routings = [balanced_routing(job, failed, 0), balanced_routing(job, failed, 1),
                dissolving_routing(job, failed), lane_routing(job, failed),
                *(mixed_routing(job, failed, keep) for keep in range(1, M))]
    for routing in filter(None, routings):
        loads = routing.busiest
        assert routing_bound(job, loads, failure_bound) == lower_bound(job, failed, busiest=loads).value_ms



# ------------------------------------------------------------------------------ the timeline text


@FAST
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 2), st.sampled_from(["F", "B", "W", "ALLREDUCE"]),
                          st.sampled_from([0.0, -0.0, 1.0, 1.0000004, 2.5, 1e-7, 3684.4000000001, 7.0]),
                          st.sampled_from([0.0, 0.5, 1.0 / 3.0])), max_size=30))
def test_timeline_text_equals_reference(rows):
    """The CLI's timeline text (lexsort order, one text per distinct time) is the old text byte for
    byte, on op lists full of equal workers and times, -0.0 beside 0.0 included."""
    import dataclasses

    from cli.timeline_text import timeline_text
    from planner.solve import plan
    from tests.planner.reference.timeline_text_36aee87 import timeline_text as reference_text

    ops = [Op((p, s), kind, None if kind == "ALLREDUCE" else (p, 0), t, t + d) for p, s, kind, t, d in rows]
    result = dataclasses.replace(_small_plan(plan), ops=ops)
    assert timeline_text(result) == reference_text(result)


_PLANS: dict = {}


def _small_plan(plan):
    if not _PLANS:
        job = JobSpec.parse({"pipelines": 3, "stages": 3, "microbatches": 2, "forward_ms": 1.0,
                             "backward_input_ms": 1.0, "backward_weight_ms": 1.0, "allreduce_ms": 1.0,
                             "p2p_ms": 0.5, "activation_mb": 1.0, "optimizer_ms": 1.0})
        _PLANS["small"] = plan(job, [(0, 0)], use_cp=False)
    return _PLANS["small"]


# ------------------------------------------------------------------------------------ validation


def _broken(ops: list[Op], rng: random.Random, D: int, S: int) -> list[Op]:
    """One random change that may or may not break a rule (times nudged by amounts around the
    1e-6 ms tolerance or far beyond, ops moved, dropped, doubled, relabelled)."""
    ops = ops[:]
    i = rng.randrange(len(ops))
    o = ops[i]
    what = rng.randrange(8)
    nudge = rng.choice([1e-7, 9e-7, 1.1e-6, 1e-5, 0.3, 2.0]) * rng.choice([-1, 1])
    if what == 0:  # shift the op, duration kept
        ops[i] = Op(o.worker, o.kind, o.microbatch, o.start_ms + nudge, o.end_ms + nudge)
    elif what == 1:  # stretch or shrink it
        ops[i] = Op(o.worker, o.kind, o.microbatch, o.start_ms, o.end_ms + nudge)
    elif what == 2:  # another worker
        w = (rng.randrange(D), rng.choice([o.worker[1], rng.randrange(S)]))
        ops[i] = Op(w, o.kind, o.microbatch, o.start_ms, o.end_ms)
    elif what == 3:
        del ops[i]
    elif what == 4:
        ops.append(o)
    elif what == 5 and o.microbatch is not None:  # another micro-batch, or none
        mb = rng.choice([None, (o.microbatch[0], 0), (rng.randrange(D), o.microbatch[1])])
        ops[i] = Op(o.worker, o.kind, mb, o.start_ms, o.end_ms)
    elif what == 6:  # another kind
        ops[i] = Op(o.worker, rng.choice(["F", "B", "W", "ALLREDUCE", "OPTIMIZER"]), o.microbatch,
                    o.start_ms, o.end_ms)
    else:  # every op of one worker later or earlier
        w = o.worker
        ops = [x if x.worker != w else Op(w, x.kind, x.microbatch, x.start_ms + nudge, x.end_ms + nudge)
               for x in ops]
    return ops


@settings(max_examples=120, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(plans(max_d=3, max_s=3, max_m=3), st.integers(0, 3))
def test_validate_equals_reference(case, changes):
    """`validate` (array check of valid plans first) returns exactly the per-op checks' violations,
    on random valid plans and on plans with up to three random changes, with the failure set and
    the memory limit sometimes changed too."""
    from planner.validate import per_op_violations, validate

    job, ops, rng = case
    if ops is None:
        return
    failed = sorted({tuple(w) for w in _failed_of(job, ops)})
    for _ in range(changes):
        if ops:
            ops = _broken(ops, rng, job.pipelines, job.stages)
    if rng.random() < 0.2 and ops:
        failed = failed + [rng.choice(ops).worker]
    if rng.random() < 0.2:
        job = JobSpec.parse({**job.filled(), "memory_limit_mb": rng.choice([2.0, 3.0, 4.0])})
    assert validate(job, failed, ops) == per_op_violations(job, set(failed), ops)


def _failed_of(job: JobSpec, ops: list[Op]) -> list[tuple[int, int]]:
    """Workers with no op, which a random plan of a failure set leaves empty."""
    busy = {op.worker for op in ops}
    return [(p, s) for p in range(job.pipelines) for s in range(job.stages) if (p, s) not in busy]


def test_validate_takes_the_array_path_on_planner_plans(small_job):
    """The array check accepts the planner's own plans (else the speed-up would not apply)."""
    from planner.solve import plan
    from planner.validate import _valid_on_arrays

    for failed in ([], [(0, 0)], [(1, 2), (2, 2)]):
        result = plan(small_job, failed, use_cp=False)
        assert _valid_on_arrays(small_job, set(result.failed), list(result.ops))


@settings(max_examples=300, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(plans(max_d=3, max_s=3, max_m=3), st.integers(1, 2))
def test_each_rule_on_arrays_equals_its_reference_check(case, changes):
    """Rule by rule (so that one check dropped from the arrays is seen even where another rule
    breaks too): the array verdict of rules 1-2 and, where those hold, of 3, 4, 5 and 6 each
    equals whether the per-op check of that rule finds nothing."""
    from planner import validate as ref
    from planner.validate import _rules_on_arrays

    job, ops, rng = case
    if ops is None:
        return
    failed = sorted(set(_failed_of(job, ops)))
    for _ in range(changes):
        if ops:
            ops = _broken(ops, rng, job.pipelines, job.stages)
    if rng.random() < 0.2:
        job = JobSpec.parse({**job.filled(), "memory_limit_mb": rng.choice([2.0, 3.0, 4.0])})
    verdicts = _rules_on_arrays(job, set(failed), ops)
    found = ref.per_op_violations(job, set(failed), ops)
    first_rules = not any(m.startswith(("rule 1", "rule 2", "contract")) for m in found)
    if verdicts is None:
        assert not first_rules
        return
    assert verdicts["1-2"] == first_rules
    if not first_rules:
        return
    where = {(o.kind, o.microbatch[0], o.microbatch[1], o.worker[1]): o for o in ops if o.kind in "FBW"}
    assert verdicts["3"] == (ref._check_order(job, where) == [])
    assert verdicts["4"] == (ref._check_one_at_a_time(ops) == [])
    assert verdicts["5"] == (ref._check_collectives(job, set(failed), ops, where) == [])
    assert verdicts["6"] == (ref._check_memory(job, ops) == [])


@settings(max_examples=80, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(sweeps(), st.sampled_from([None, 0.0, 0.5]), st.sampled_from([None, 0, 1]), st.booleans())
def test_list_schedule_equals_reference(case, tolerance, slack, feed):
    """The list scheduler (shared worker and micro-batch tuples, no divmod per event) writes the
    reference's schedule op for op under every policy knob."""
    from planner.heuristic import Policy, list_schedule
    from tests.planner.reference.heuristic_36aee87 import list_schedule as reference_list_schedule

    job, routing, _, _ = case
    policy = Policy(w_tolerance=tolerance, ahead_slack=slack, feed_bottleneck=feed)
    try:
        want = reference_list_schedule(job, routing, policy)
    except RuntimeError as exc:  # a stall: both must stall alike
        with pytest.raises(RuntimeError, match=str(exc).replace("[", r"\[").replace("(", r"\(")):
            list_schedule(job, routing, policy)
        return
    got = list_schedule(job, routing, policy)
    dead = set(routing.failed)
    if any(routing.load[p][s] == 0 for p in range(job.pipelines) for s in range(job.stages)
           if (p, s) not in dead):
        # An alive worker given nothing: the reference never emitted its stage's collectives (it
        # waited for that worker to finish); the fix emits them when the last worker with work is
        # done (tests/planner/test_lanes.py). Every F, B and W is still the reference's.
        assert [o for o in got if o.kind in "FBW"] == [o for o in want if o.kind in "FBW"]
        collective_stages = {o.worker[1] for o in got if o.kind == "ALLREDUCE"}
        assert collective_stages == set(range(job.stages))
        return
    assert got == want


@FAST
@given(sweeps())
def test_insertion_orders_equal_reference(case):
    """Insertion orders (workers that receive nothing copy the template's order directly) equal
    the reference's for every routing, with the job's own fault-free plan as the template."""
    from planner.fault_free import fault_free_plan
    from planner.sweep import insertion_orders
    from tests.planner.reference import sweep_36aee87 as reference_sweep

    job, routing, _, _ = case
    template = list(fault_free_plan(job).ops)
    want = reference_sweep.insertion_orders(job, routing, template)
    assert insertion_orders(job, routing, template) == want
