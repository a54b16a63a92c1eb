"""`python -m cli.main bench` end to end on the tiny suite, and its one-line errors."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bench(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", "bench", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=timeout)


def test_tiny_suite_writes_tables_json_and_plots(tmp_path):
    out = tmp_path / "out"
    done = bench("--suite", "tiny", "-o", str(out), "--seed", "1", "--no-progress")
    assert done.returncode == 0, done.stderr
    for name in ("sweep.md", "sweep.json", "sweep.png", "day.md", "day.json", "day.png", "gantt.png",
                 "summary.md"):
        assert (out / name).stat().st_size > 0, name
    for png in out.glob("*.png"):
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    sweep = json.loads((out / "sweep.json").read_text())
    assert {r["failed"] for r in sweep["rows"]} == {0, 1, 2, 3}
    first = sweep["rows"][0]
    assert set(first["strategies"]) == {"adaptive", "drop", "oobleck", "bamboo", "checkpoint"}
    assert first["strategies"]["adaptive"]["vs_fault_free"] == 1.0
    day = json.loads((out / "day.json").read_text())
    assert day["failures"] > 0
    assert set(day["lookups"]) == {"precomputed", "solved_live", "reused", "live_wait_s"}
    assert "| adaptive re-routing (this planner) |" in (out / "day.md").read_text()
    # The terminal shows the headline: the spread rows with every strategy's throughput, then the day.
    lines = done.stdout.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("job "))
    assert lines[header].split()[3:9] == ["adaptive", "drop", "oobleck", "bamboo", "checkpoint", "vs"]
    shown = [line.split() for line in lines[header + 2:header + 6]]
    spread = [r for r in sweep["rows"] if r["pattern"] == "spread"]
    assert len(spread) == 4 and lines[header + 6] == ""
    for row, cells in zip(spread, shown, strict=True):
        assert cells[2:4] == ["spread", str(row["failed"])]
        assert [float(c) for c in cells[4:9]] == [row["strategies"][s]["throughput_mb_s"] for s in
                                                  ("adaptive", "drop", "oobleck", "bamboo", "checkpoint")]
    day_header = lines.index(next(line for line in lines if line.startswith("strategy ")))
    seconds = day["hours"] * 3600
    for name, cells in zip(day["days"], (line.split() for line in lines[day_header + 2:]), strict=False):
        relative = day["days"][name]["useful_microbatches"] / (day["fault_free_mb_s"] * seconds)
        assert cells[:2] == [name, f"{relative:.4f}"]
    assert lines[-1].startswith("wrote ") and str(out) in lines[-1]


def test_own_job_and_trace_file(tmp_path):
    job = tmp_path / "job.json"
    job.write_text(json.dumps({"pipelines": 3, "stages": 2, "microbatches": 4, "forward_ms": 1.0,
                               "backward_input_ms": 1.0, "backward_weight_ms": 1.0, "p2p_ms": 0.1,
                               "allreduce_ms": 2.0, "optimizer_ms": 0.5, "activation_mb": 1.0}))
    trace = tmp_path / "t.csv"
    trace.write_text("time_s,pipeline,stage,event\n60,0,1,fail\n600,0,1,rejoin\n")
    out = tmp_path / "out"
    done = bench("--job", str(job), "--trace", str(trace), "--hours", "1", "--fail-counts", "0,1",
                 "--patterns", "spread", "--strategies", "adaptive,drop", "-o", str(out), "--no-progress")
    assert done.returncode == 0, done.stderr
    rows = json.loads((out / "sweep.json").read_text())["rows"]
    assert [r["failed"] for r in rows] == [0, 1] and set(rows[0]["strategies"]) == {"adaptive", "drop"}
    assert json.loads((out / "day.json").read_text())["failures"] == 1


@pytest.mark.parametrize("args, message", [
    (["--suite", "nope"], "invalid choice"),
    (["--strategies", "adaptive,magic"], "--strategies"),
    (["--patterns", "everywhere"], "--patterns"),
    (["--fail-counts", "1,x"], "--fail-counts"),
    (["--detect-s", "-1"], "--detect-s"),
    (["--checkpoint-interval-s", "0"], "--checkpoint-interval-s"),
    (["--mtbf-hours", "0"], "--mtbf-hours"),
    (["--repair-hours", "-1"], "--repair-hours"),
    (["--job", "/nonexistent/job.json"], "no such file"),
    (["--trace", "/nonexistent/t.csv", "--suite", "tiny"], "cannot read"),
    (["--suite", "tiny", "--job", "x.json"], "choose one"),
])
def test_bad_options_are_one_line_and_exit_2(tmp_path, args, message):
    done = bench(*args, "-o", str(tmp_path / "o"), "--no-progress", timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], done.stderr
    assert "Traceback" not in done.stderr
