"""Bad job specs and failure sets raise SpecError naming the field or the stage."""

from __future__ import annotations

import pytest

from planner.compress import check_plannable
from planner.failures import enumerate_failure_classes, normalize, parse_failure_set
from planner.solve import plan
from planner.spec import JobSpec, SpecError


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"forward_ms": [1.0, 2.0]}, "forward_ms", "needs 3 entries"),
        ({"activation_mb": [1.0, 1.0, 1.0, 1.0]}, "activation_mb", "needs 3 entries"),
        ({"backward_input_ms": 0}, "backward_input_ms", "must be > 0"),
        ({"backward_weight_ms": [1.0, -2.0, 1.0]}, "backward_weight_ms", "must be > 0"),
        ({"p2p_ms": -0.1}, "p2p_ms", "must be >= 0"),
        ({"allreduce_ms": float("nan")}, "allreduce_ms", "finite"),
        ({"optimizer_ms": float("inf")}, "optimizer_ms", "finite"),
        ({"memory_limit_mb": 0.5}, "memory_limit_mb", "below one micro-batch"),
        ({"memory_limit_mb": -1.0}, "memory_limit_mb", ">= 0"),  # 0 allowed: 0 MB activations
        ({"stages": 0}, "stages", "greater than or equal to 1"),
        ({"microbatches": "many"}, "microbatches", "integer"),
        ({"forward_ms": None}, "forward_ms", "required"),
        ({"memory_limit_mbb": 4.0}, "memory_limit_mbb", "unknown field"),
        ({"pipelines": "3"}, "pipelines", "no conversion from strings"),
        ({"pipelines": True}, "pipelines", "valid integer"),
        ({"forward_ms": "10"}, "forward_ms", "valid number"),
        ({"activation_w_mb": 2.0}, "activation_w_mb", "at most activation_mb"),
        ({"activation_w_mb": [0.5, 1.5, 0.5]}, "activation_w_mb", "at most activation_mb"),
        # Magnitudes floats cannot plan with: 1e308 overflowed the CP-SAT scale (a traceback) and
        # made bounds infinite; 1e10 beside 0.001 ms ops broke rule 2 by rounding.
        ({"forward_ms": 1e308}, "forward_ms", "at most 1e+07 ms"),
        ({"allreduce_ms": [1.0, 2e7, 1.0]}, "allreduce_ms", "at most 1e+07 ms"),
        ({"activation_mb": [1e308, 1.0, 1.0], "memory_limit_mb": 1e308}, "activation_mb",
         "at most 1e+12 MB"),
        ({"memory_limit_mb": 2e12}, "memory_limit_mb", "at most 1e+12 MB"),
    ],
)
def test_bad_field_is_named(make_job, changes, field, words):
    with pytest.raises(SpecError) as err:
        make_job(**changes)
    assert err.value.field == field
    assert field in str(err.value) and words in str(err.value)


def test_spec_must_be_an_object():
    with pytest.raises(SpecError, match="expected a JSON object"):
        JobSpec.parse([1, 2, 3])


@pytest.mark.parametrize(
    ("failed", "words"),
    [
        ([(0, 1), (1, 1), (2, 1)], "stage 1 has no surviving peer"),
        ([(3, 0)], "failed[0]: pipeline 3 is out of range 0..2"),
        ([(0, 0), (0, -1)], "failed[1]: stage -1 is out of range 0..2"),
        ([(0, 1, 2)], "failed[0]: a worker is [pipeline, stage]"),
        ([("0", 1)], "failed[0]: a worker is [pipeline, stage]"),
        ([(True, 1)], "failed[0]: a worker is [pipeline, stage]"),
    ],
)
def test_bad_failure_set_is_named(small_job, failed, words):
    with pytest.raises(SpecError) as err:
        parse_failure_set(small_job, failed)
    assert words in str(err.value)
    assert err.value.field == "failed"


def test_values_at_the_caps_still_plan(make_job):
    """The caps refuse nothing a plan can hold: 1e7 ms beside 0.01 ms ops, an exabyte of memory."""
    job = make_job(forward_ms=1e7, backward_weight_ms=0.01, memory_limit_mb=1e12)
    result = plan(job, [(0, 1)], use_cp=False)  # validated inside: rule 2 holds at this scale
    assert result.lower_bound_ms <= result.iteration_ms


@pytest.mark.timeout(30)  # without the check it plans for hours and eats the machine's memory
def test_plan_refuses_a_job_too_large_to_plan_before_planning_it():
    """12 billion F/B/W ops in one pipeline: a clear refusal, not hours of planning (it hung)."""
    job = JobSpec.parse({"pipelines": 1, "stages": 4096, "microbatches": 1_000_000, "forward_ms": 1.0,
                         "backward_input_ms": 1.0, "backward_weight_ms": 1.0, "p2p_ms": 0.0,
                         "allreduce_ms": 0.0, "optimizer_ms": 0.0, "activation_mb": 1.0})
    with pytest.raises(SpecError, match="job too large to plan: .* over the planner's limit") as err:
        plan(job)
    assert err.value.field == "microbatches"


def test_the_size_limit_counts_what_is_scheduled_at_once():
    """A compressed job schedules the damaged pipelines, a receiver and the representative; an
    uncompressed one every pipeline; a fault-free compressed one a single pipeline."""
    def job(pipelines, microbatches):
        return JobSpec.parse({"pipelines": pipelines, "stages": 4, "microbatches": microbatches,
                              "forward_ms": 1.0, "backward_input_ms": 1.0, "backward_weight_ms": 1.0,
                              "p2p_ms": 0.0, "allreduce_ms": 0.0, "optimizer_ms": 0.0,
                              "activation_mb": 1.0})

    per_pipeline_fits, per_pipeline_over = job(1, 33_333), job(1, 33_334)  # 399,996 and 400,008 ops
    check_plannable(per_pipeline_fits, (), compressed=False)
    with pytest.raises(SpecError, match="400,008 to schedule at once"):
        check_plannable(per_pipeline_over, (), compressed=False)
    check_plannable(job(1000, 33_333), (), compressed=True)  # one pipeline, replicated
    check_plannable(job(1000, 11_111), ((0, 1),), compressed=True)  # 3 x 133,332 ops
    with pytest.raises(SpecError, match=r"\(2 damaged pipelines, a receiver and the representative\)"):
        check_plannable(job(1000, 11_111), ((0, 1), (1, 2)), compressed=True)  # 4 x 133,332 ops
    with pytest.raises(SpecError, match=r"\(4 pipelines\)"):
        check_plannable(job(4, 11_111), ((0, 1),), compressed=False)


def test_plan_refuses_a_job_whose_iteration_outgrows_float_milliseconds():
    """1e7 ms forwards beside 0.001 ms B and W: at 20,000 micro-batches every B and W came out
    0.001007 ms long (rule 2, a PlanInvalid traceback); the busiest worker's work says so first."""
    spec = {"pipelines": 1, "stages": 2, "microbatches": 20_000, "forward_ms": 1e7,
            "backward_input_ms": 0.001, "backward_weight_ms": 0.001, "p2p_ms": 0.0,
            "allreduce_ms": 0.0, "optimizer_ms": 0.0, "activation_mb": 1.0}
    with pytest.raises(SpecError, match="job too long to plan: .* works 2e\\+11 ms") as err:
        plan(JobSpec.parse(spec))
    assert err.value.field == "microbatches"
    # The failure set counts: three pipelines' work on one survivor is three times as long.
    three = JobSpec.parse({**spec, "pipelines": 3, "microbatches": 4, "forward_ms": 9e6})
    check_plannable(three, (), compressed=False)  # 4 x 9e6 = 3.6e7 ms
    with pytest.raises(SpecError, match="works 1.08e\\+08 ms"):
        check_plannable(three, ((0, 0), (1, 0)), compressed=False)


def test_plan_refuses_a_dead_stage(small_job):
    with pytest.raises(SpecError, match="stage 2 has no surviving peer"):
        plan(small_job, [(0, 2), (1, 2), (2, 2)], use_cp=False)


def test_duplicates_in_a_failure_set_are_merged(small_job):
    assert parse_failure_set(small_job, [(1, 2), [1, 2]]) == ((1, 2),)
    assert normalize(small_job, [(1, 2), (1, 2)]).key == "0:2"


def test_negative_max_failures(small_job):
    with pytest.raises(SpecError, match="max_failures"):
        list(enumerate_failure_classes(small_job, -1))


def test_failure_class_cap_is_checked_before_enumerating():
    from planner.failures import TooManyClasses

    # 2 x 4096 with up to 2 failures: at least 1 + 4096 + C(4096, 2) (about 8.4 million) classes,
    # each single-pipeline stage subset being one; refused by arithmetic, nothing allocated.
    job = JobSpec.parse({"pipelines": 2, "stages": 4096, "microbatches": 12, "forward_ms": 1.0,
                         "backward_input_ms": 1.0, "backward_weight_ms": 1.0, "p2p_ms": 0.1,
                         "allreduce_ms": 1.0, "optimizer_ms": 1.0, "activation_mb": 1.0})
    with pytest.raises(TooManyClasses, match="more than 20000 failure classes"):
        next(enumerate_failure_classes(job, 2, max_classes=20_000))


def test_failure_class_cap_counts_exactly(make_job):
    job = make_job()  # 3 x 3: every class up to 2 failures, counted without a cap
    every = list(enumerate_failure_classes(job, 2))
    assert list(enumerate_failure_classes(job, 2, max_classes=len(every))) == every
    with pytest.raises(SpecError, match="more than"):
        list(enumerate_failure_classes(job, 2, max_classes=len(every) - 1))


@pytest.mark.parametrize("failed", [[], [(1, 0)]])
def test_a_tiny_activation_plans_like_none(failed):
    """Positive activations below 1e-300 MB are valid input; memory / activation then overflows
    int(), which once ended the plan in an OverflowError. Expected: the plan and bound of the same
    job with activations of 0 (nothing limits memory either way)."""
    from planner.validate import validate
    spec = {"pipelines": 2, "stages": 2, "microbatches": 4, "forward_ms": 1.0,
            "backward_input_ms": 1.0, "backward_weight_ms": 1.0, "p2p_ms": 0.5, "allreduce_ms": 1.0,
            "optimizer_ms": 0.5, "memory_limit_mb": 4.0}
    tiny = JobSpec.parse({**spec, "activation_mb": 1e-320, "activation_w_mb": 1e-321})
    free = JobSpec.parse({**spec, "activation_mb": 0.0, "activation_w_mb": 0.0})
    got, want = plan(tiny, failed, use_cp=False), plan(free, failed, use_cp=False)
    assert validate(tiny, failed, got.ops) == []
    assert (got.iteration_ms, got.lower_bound_ms) == (want.iteration_ms, want.lower_bound_ms)
