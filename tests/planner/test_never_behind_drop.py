"""Adaptive plans are never slower than dropping the damaged pipelines (issue 8's first bar).

Dropping means the undamaged D' pipelines carry the whole global batch of D x M micro-batches: the
busiest runs ceil(D x M / D') of them, so its period is the fault-free period of one pipeline with
that many micro-batches (how `recycle bench` prices it), planned here on its own (an independent
route to the drop period, not the planner's candidate). The adapted plan's period must not exceed
it, whether or not D' divides D x M, with rule 6's activation_w_mb and tight memory limits too;
every plan must also be valid."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from planner.solve import plan
from planner.spec import JobSpec
from planner.validate import validate

BASE = {"forward_ms": 10.0, "backward_input_ms": 10.0, "backward_weight_ms": 6.0, "p2p_ms": 0.5,
        "cross_pipeline_p2p_ms": 0.75, "allreduce_ms": 20.0, "optimizer_ms": 2.0, "activation_mb": 1.0}


@st.composite
def damaged_jobs(draw):
    pipelines = draw(st.integers(3, 4))
    stages = draw(st.integers(2, 4))
    damaged = draw(st.integers(1, pipelines - 1))
    healthy = pipelines - damaged
    microbatches = draw(st.integers(1, 6))
    pattern = draw(st.sampled_from(["pipeline", "stage", "spread"]))
    if pattern == "pipeline":  # several workers of one pipeline
        stage_set = draw(st.sets(st.integers(0, stages - 1), min_size=1, max_size=stages))
        failed = [(0, s) for s in sorted(stage_set)]
        damaged = 1
    elif pattern == "stage":  # one stage, several pipelines
        s = draw(st.integers(0, stages - 1))
        failed = [(p, s) for p in range(damaged)]
    else:
        failed = [(p, draw(st.integers(0, stages - 1))) for p in range(damaged)]
    healthy = pipelines - len({p for p, _ in failed})
    memory = {}
    if draw(st.booleans()):
        memory = {"activation_w_mb": draw(st.sampled_from([0.0, 0.5])),
                  "memory_limit_mb": float(draw(st.integers(1, stages)))}
    spec = {**BASE, **memory, "stages": stages}
    job = JobSpec.parse({**spec, "pipelines": pipelines, "microbatches": microbatches})
    return job, failed, healthy, spec


@settings(max_examples=40, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(damaged_jobs())
def test_adapted_period_never_above_dropping_the_damaged_pipelines(case):
    job, failed, healthy, spec = case
    adapted = plan(job, failed, use_cp=False)
    assert validate(job, failed, adapted.ops) == []
    busiest = -(-job.pipelines * job.microbatches // healthy)
    dropped = plan(JobSpec.parse({**spec, "pipelines": 1, "microbatches": busiest}), [], use_cp=False)
    assert adapted.iteration_ms <= dropped.iteration_ms + 1e-6, (
        f"{failed}: adapted {adapted.iteration_ms} > dropping to {healthy} pipelines {dropped.iteration_ms}")
