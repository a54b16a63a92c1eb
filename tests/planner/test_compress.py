"""Compressed plans (planner/compress.py): the expansion is the plan built directly, op for op.

Expected plans are built here by a different route than the expansion: the planned part mapped to
concrete pipelines op by op, `replicate` for the untouched pipelines, the all-reduce start of each
stage taken as the latest one by hand; for dropping, the existing full-size `relabel_dropped`. The
expanded plans are then checked by the unchanged validator and replayed by the unchanged simulator.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest

from planner.compress import ExpandedOps, dropping_expansion, reroute_expansion, with_pipelines
from planner.dropping import dropped_job, relabel_dropped
from planner.failures import normalize
from planner.fault_free import fault_free_plan, replicate
from planner.instructions import instruction_stream_json
from planner.simulator import replay
from planner.solve import _solve_canonical, concrete_ops, plan
from planner.timeline import Op
from planner.validate import validate

FAILURE_SETS = [[(2, 1)], [(1, 0), (4, 2)]]  # one failure; failures in two pipelines


def _key(op: Op):
    return (op.worker, op.start_ms, op.kind, op.microbatch, op.end_ms)


def _sorted(ops) -> list[Op]:
    return sorted(ops, key=_key)


@pytest.fixture(scope="module")
def job6(make_job):
    return make_job(pipelines=6)


def _reroute(job, failed, receivers):
    """(canonical, planned part, template, expansion) of the compressed re-routing plan."""
    canonical = normalize(job, failed)
    damaged = len({p for p, _ in canonical.failed})
    sub = with_pipelines(job, damaged + receivers)
    template = list(fault_free_plan(job).ops)
    planned, *_ = _solve_canonical(sub, canonical.failed, 1e6, False, 0, template=template)
    return canonical, planned, template, reroute_expansion(job, canonical.failed, canonical.to_concrete,
                                                          planned, template, receivers)


def _direct_reroute(job, canonical, planned, template, receivers) -> list[Op]:
    """The full plan built directly: planned part + the template on every other pipeline, every
    collective of a stage moved to the stage's latest ALLREDUCE start, then concrete numbering."""
    planned_count = len({p for p, _ in canonical.failed}) + receivers
    full = list(planned) + [o for o in replicate(job, template) if o.worker[0] >= planned_count]
    common: dict[int, float] = {}
    for o in full:
        if o.kind == "ALLREDUCE":
            common[o.worker[1]] = max(common.get(o.worker[1], 0.0), o.start_ms)
    own_ar = {o.worker: o.start_ms for o in full if o.kind == "ALLREDUCE"}
    moved = []
    for o in full:
        if o.microbatch is None:
            d = common[o.worker[1]] - own_ar[o.worker]
            o = Op(o.worker, o.kind, None, o.start_ms + d, o.end_ms + d)
        moved.append(o)
    return concrete_ops(canonical, moved)


@pytest.mark.parametrize("failed", FAILURE_SETS)
@pytest.mark.parametrize("receivers", [1, 2])
def test_reroute_expansion_is_the_direct_plan(job6, failed, receivers):
    canonical, planned, template, expansion = _reroute(job6, failed, receivers)
    expanded = list(expansion.expand())
    assert _sorted(expanded) == _sorted(_direct_reroute(job6, canonical, planned, template, receivers))
    concrete_failed = sorted(canonical.concrete_worker(w) for w in canonical.failed)
    assert validate(job6, concrete_failed, expanded) == []
    assert validate(expansion.job, expansion.failed, list(expansion.ops)) == []
    # Rule 1 counted here: each (home, index, stage, kind) once, on no failed worker.
    served = Counter((o.microbatch, o.worker[1], o.kind) for o in expanded if o.microbatch is not None)
    assert set(served.values()) == {1}
    assert len(served) == 6 * 4 * 3 * 3
    assert not {o.worker for o in expanded} & set(concrete_failed)
    # Copies of the representative change nothing in the replayed period.
    assert replay(job6, expanded).iteration_ms == pytest.approx(
        replay(expansion.job, list(expansion.ops)).iteration_ms, abs=1e-9)


@pytest.mark.parametrize("failed", FAILURE_SETS)
def test_dropping_expansion_is_relabel_dropped(job6, failed):
    """6 pipelines, one damaged: 4 extra micro-batches over 5 pipelines (two groups, one slot
    apart); two damaged: 8 over 4 (one group)."""
    canonical = normalize(job6, failed)
    dropped = dropped_job(job6, canonical.failed)
    template = list(fault_free_plan(dropped).ops)
    direct = concrete_ops(canonical, relabel_dropped(job6, canonical.failed, dropped,
                                                         replicate(dropped, template)))
    expansion = dropping_expansion(job6, canonical.failed, canonical.to_concrete, template)
    expanded = list(expansion.expand())
    assert _sorted(expanded) == _sorted(direct)
    assert validate(job6, sorted(canonical.concrete_worker(w) for w in canonical.failed), expanded) == []
    assert replay(job6, expanded).iteration_ms <= fault_free_plan(dropped).iteration_ms + 1e-9


@pytest.mark.parametrize("failed", FAILURE_SETS + [[]])
def test_compressed_plan_is_valid_lazy_and_never_behind_dropping(job6, failed):
    result = plan(job6, failed, use_cp=False, compress=True, receivers=1)
    assert isinstance(result.ops, ExpandedOps) and result.expansion is not None
    result.summary_json()
    assert len(result.ops) > 0 and result.ops._ops is None  # summary and length build nothing
    expanded = list(result.ops)
    assert len(expanded) == len(result.ops)
    assert validate(job6, result.failed, expanded) == []
    assert replay(job6, expanded).iteration_ms == pytest.approx(result.iteration_ms, abs=1e-9)
    assert len(result.timeline_json()["ops"]) == len(expanded)
    if failed:
        dropped = dropped_job(job6, normalize(job6, failed).failed)
        assert result.iteration_ms <= fault_free_plan(dropped).iteration_ms + 1e-9


def test_small_jobs_are_not_compressed(job6):
    assert plan(job6, [(2, 1)], use_cp=False).expansion is None


@pytest.mark.parametrize("failed", [[(0, 0), (1, 1)], [(0, 0), (1, 1), (2, 2)]])
def test_too_few_undamaged_pipelines_for_a_representative(make_job, failed):
    """3 pipelines: two damaged leave one receiver and no representative, three none at all; the
    full plan is made instead of a compressed one."""
    job = make_job(pipelines=3)
    result = plan(job, failed, use_cp=False, compress=True, receivers=5)
    assert result.expansion is None
    assert validate(job, result.failed, result.ops) == []


def test_receivers_are_capped_to_leave_a_representative(make_job):
    job = make_job(pipelines=4)  # 1 damaged: at most 2 receivers, then the representative
    result = plan(job, [(1, 1)], use_cp=False, compress=True, receivers=9)
    assert result.expansion is not None
    assert validate(job, result.failed, list(result.ops)) == []
    assert "rerouted_ms" in result.extra["compressed_candidates"] or \
        result.iteration_ms <= result.lower_bound_ms + 1e-6


@pytest.mark.parametrize("failed", FAILURE_SETS)
def test_instruction_streams_read_the_compressed_plan(job6, failed):
    canonical, _, _, reroute = _reroute(job6, failed, 1)
    dropped = dropped_job(job6, canonical.failed)
    drop = dropping_expansion(job6, canonical.failed, canonical.to_concrete, fault_free_plan(dropped).ops)
    dead = {canonical.concrete_worker(w) for w in canonical.failed}
    for expansion in (reroute, drop):
        lazy = ExpandedOps(expansion)
        full = list(expansion.expand())
        for w in [(p, s) for p in range(6) for s in range(3) if (p, s) not in dead]:
            assert (instruction_stream_json(job6, sorted(dead), lazy, w)
                    == instruction_stream_json(job6, sorted(dead), full, w)), w
        assert lazy._ops is None


@pytest.mark.parametrize("failed", FAILURE_SETS + [[]])
def test_timeline_text_streams_the_expansion_in_order(job6, failed):
    """The CLI writes a compressed plan's timeline from the expansion directly; the text must be
    the one written from the expanded op list (sorted by worker and start)."""
    import dataclasses

    from cli.timeline_text import timeline_text

    result = plan(job6, failed, use_cp=False, compress=True, receivers=1)
    expanded = dataclasses.replace(result, ops=list(result.ops), expansion=None)
    assert timeline_text(result) == timeline_text(expanded)
    assert json.loads(timeline_text(result)) == expanded.timeline_json()
