"""Exports of the contract timeline: Chrome trace, Gantt PNG, torch.distributed.pipelining CSV."""

from __future__ import annotations

import json
import struct

import pytest

from planner.export import chrome_trace, gantt_png, pipelining_csv
from planner.export.chrome import KIND_CNAME
from planner.solve import plan
from planner.spec import JobSpec

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == PNG_MAGIC
    return struct.unpack(">II", data[16:24])  # IHDR width, height


# ------------------------------------------------------------------------------------------ chrome


def test_chrome_trace_structure(failed_plan):
    timeline = failed_plan.timeline_json()
    trace = json.loads(json.dumps(chrome_trace(timeline)))  # plain JSON all the way down
    events = trace["traceEvents"]
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == len(timeline["ops"])
    for e in complete:
        assert e["dur"] >= 0 and e["ts"] >= 0
        assert e["pid"] == e["args"]["worker"][0] and e["tid"] == e["args"]["worker"][1]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    assert threads[(1, 2)] == "worker [1, 2]"
    assert threads[(0, 1)] == "worker [0, 1] failed"
    assert {e["cname"] for e in complete} == set(KIND_CNAME.values())
    assert len(set(KIND_CNAME.values())) == len(KIND_CNAME)  # a distinct colour per kind


def test_chrome_trace_times_names_and_rerouting(failed_plan):
    timeline = failed_plan.timeline_json()
    complete = [e for e in chrome_trace(timeline)["traceEvents"] if e["ph"] == "X"]
    by_key = {(e["pid"], e["tid"], e["ts"]): e for e in complete}
    rerouted = 0
    for op in timeline["ops"]:
        p, s = op["worker"]
        e = by_key[(p, s, round(op["start_ms"] * 1000, 3))]
        assert e["dur"] == pytest.approx((op["end_ms"] - op["start_ms"]) * 1000, abs=1e-3)
        if "microbatch" in op:
            home, index = op["microbatch"]
            assert e["name"] == f"{op['kind']} {home}.{index}"
            assert e["args"]["rerouted"] == (home != p)
            rerouted += home != p
        else:
            assert e["name"] == op["kind"] and "rerouted" not in e["args"]
    # Worker [0, 1] failed: at least its 4 micro-batches run F, B and W on a peer (the planner may
    # also dissolve pipeline 0 entirely); a micro-batch's F, B and W always move together.
    assert rerouted >= 3 * 4 and rerouted % 3 == 0


def test_exports_reject_malformed_timelines():
    with pytest.raises(ValueError, match="timeline.ops"):
        chrome_trace({"format": "recycle.timeline/v1"})
    with pytest.raises(ValueError, match=r"ops\[0\]"):
        chrome_trace({"ops": [{"kind": "F"}]})
    with pytest.raises(ValueError, match="unknown kind"):
        gantt_png({"ops": [{"worker": [0, 0], "kind": "X", "start_ms": 0, "end_ms": 1}]})


# ------------------------------------------------------------------------------------------- gantt


def test_gantt_png_of_a_failed_plan(failed_plan):
    png = gantt_png(failed_plan.timeline_json(), width_px=1200)
    width, height = png_size(png)
    assert width == 1200 and height > 200
    assert len(png) > 20_000  # bars, labels and legend, not an empty canvas


def test_gantt_png_of_the_8x8x24_scenario(scenario_8x8x24):
    job = JobSpec.parse(scenario_8x8x24)
    result = plan(job, [(0, 3), (5, 6)], use_cp=False)
    png = gantt_png(result.timeline_json())
    assert png_size(png)[0] == 1600
    assert len(png) > 50_000


def test_gantt_width_is_checked(failed_plan):
    with pytest.raises(ValueError, match="width_px"):
        gantt_png(failed_plan.timeline_json(), width_px=10)


# --------------------------------------------------------------------------------------------- csv


def test_pipelining_csv_loads_in_torch_runtime(fault_free_plan, tmp_path):
    torch_schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    from types import SimpleNamespace

    job = fault_free_plan.job
    text = pipelining_csv(fault_free_plan.timeline_json())
    path = tmp_path / "schedule.csv"
    path.write_text(text)
    # The runtime reads only these attributes of its stages before a step runs.
    stage = SimpleNamespace(num_stages=job.stages, group_size=job.stages, group_rank=0, stage_index=0)
    runtime = torch_schedules._PipelineScheduleRuntime([stage], n_microbatches=job.microbatches)
    runtime._load_csv(str(path), format="compute_only")

    rows = [line.split(",") for line in text.strip().split("\n")]
    assert [[str(a) for a in runtime.pipeline_order[r]] for r in range(job.stages)] == rows
    assert runtime.stage_index_to_group_rank == {s: s for s in range(job.stages)}
    # Our order matches the plan's: pipeline 0's stage-s worker, by start time, B written as I.
    stage1 = sorted((o for o in fault_free_plan.ops if o.worker == (0, 1) and o.microbatch),
                    key=lambda o: o.start_ms)
    assert rows[1] == [f"1{'I' if o.kind == 'B' else o.kind}{o.microbatch[1]}" for o in stage1]
    # The lowered schedule (sends/receives added by torch) runs without deadlock in torch's dry run.
    skip = {torch_schedules.UNSHARD, torch_schedules.RESHARD, torch_schedules.REDUCE_GRAD}
    lowered = {r: [a for a in acts if a.computation_type not in skip]
               for r, acts in runtime.pipeline_order_with_comms.items()}
    torch_schedules._simulate_comms_compute(lowered, lambda s: s, job.stages)


def test_pipelining_csv_refuses_failures(failed_plan):
    with pytest.raises(ValueError, match=r"1 failed worker\(s\) \(\[0, 1\]\)"):
        pipelining_csv(failed_plan.timeline_json())
