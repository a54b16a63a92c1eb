"""The service's instruction streams (`api.materials.PlanMaterial.stream_json`, which indexes a
stored plan once and shares the job's stage-boundary transfers between all the streams it builds)
equal the planner's own stream of the same concrete plan, built from the whole op list with
nothing shared (`planner.instructions.instruction_stream_json`)."""

from __future__ import annotations

import json

import pytest

from api.materials import PlanMaterial, failed_key, loads_timeline
from planner.failures import normalize
from planner.instructions import instruction_stream_json
from planner.solve import plan
from planner.spec import JobSpec
from planner.timeline import Op

JOB = JobSpec.parse({
    "pipelines": 3, "stages": 4, "microbatches": 4, "forward_ms": 1.0, "backward_input_ms": 1.0,
    "backward_weight_ms": 1.0, "p2p_ms": 0.1, "cross_pipeline_p2p_ms": 0.3, "allreduce_ms": 2.0,
    "optimizer_ms": 0.5, "activation_mb": 1.0,
})


def test_every_alive_workers_service_stream_equals_the_planners_stream():
    failed = ((2, 1), (0, 3))  # not the canonical labels: the material relabels the stored plan
    canonical = normalize(JOB, failed)
    stored = plan(JOB, canonical.failed, use_cp=False).timeline_json()
    material = PlanMaterial(JOB, failed, json.loads(json.dumps(stored)))
    concrete = [Op(tuple(o["worker"]), o["kind"], _pair(o.get("microbatch")), o["start_ms"], o["end_ms"])
                for o in material.doc["ops"]]
    alive = [(p, s) for p in range(JOB.pipelines) for s in range(JOB.stages) if (p, s) not in failed]
    assert failed_key(failed)  # a concrete failure set the service would store
    receiving = 0
    for worker in alive:
        expected = instruction_stream_json(JOB, failed, concrete, worker)
        assert material.stream_json(worker) == expected, worker
        receiving += b'"op":"RECV"' in expected
    # Transfers are part of what is compared (a worker may serve nothing when the plan dissolves
    # its pipeline, so not every one receives).
    assert receiving >= len(alive) // 2, receiving


def _pair(value):
    return None if value is None else tuple(value)


def test_a_timeline_decoded_op_by_op_equals_json_loads():
    stored = json.dumps(plan(JOB, ((1, 2),), use_cp=False).timeline_json(), separators=(",", ":"))
    texts = [
        stored,
        json.dumps(json.loads(stored), indent=2),  # whitespace everywhere
        '{"note":"\\"ops\\":[1,2]","ops":[],"x":{"ops":[{"a":1}]}}',  # "ops" inside a string, nested
        '{"ops":{"not":"an array"},"n":1}',
        ' { "ops" : [ {"k":[1,2.5e-3,null,true]} , {"k":"é\\u00e9"} ] } ',
        "{}",
        "[1]",  # not an object: json.loads decides
    ]
    for text in texts:
        assert loads_timeline(text) == json.loads(text), text


def test_a_malformed_timeline_raises_what_json_loads_raises():
    malformed = ('{"ops":[{"a":1},]}', '{"ops":[1],}', '{"ops":[1 2]}', '{"ops":[1]', '{"ops":[1]} extra', "")
    for text in malformed:
        with pytest.raises(ValueError):
            json.loads(text)
        with pytest.raises(ValueError):
            loads_timeline(text)
