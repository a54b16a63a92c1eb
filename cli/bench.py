"""`recycle bench`: every strategy on the same job, under failure sweeps and a failure trace.

`register` only defines arguments (cli/main.py imports it for every `recycle` call); the planner and
matplotlib are imported inside the command. Bad input is one line on stderr and exit code 2, through
the planner CLI's own error handling.
"""

from __future__ import annotations

import argparse
import math
import time
from pathlib import Path

from cli.plan import CliError, _add, _guarded, load_job

SUITES = ("tiny", "gpt-8x8x24", "scale", "day-4096")
GANTT_MAX_OPS = 60_000
_UNIFORM_4X4X8 = {  # shared/scenarios/uniform-4x4x8.json
    "pipelines": 4, "stages": 4, "microbatches": 8, "forward_ms": 10.0, "backward_input_ms": 10.0,
    "backward_weight_ms": 10.0, "p2p_ms": 0.5, "cross_pipeline_p2p_ms": 0.75, "allreduce_ms": 20.0,
    "optimizer_ms": 2.0, "activation_mb": 1.0,
}
_GPT_1_5B_8X8X24 = {  # shared/scenarios/gpt-1.5b-8x8x24.json (Zero Bubble's 1.5B profile)
    "pipelines": 8, "stages": 8, "microbatches": 24, "forward_ms": 18.5, "backward_input_ms": 18.1,
    "backward_weight_ms": 9.3, "p2p_ms": 0.6, "cross_pipeline_p2p_ms": 0.9, "allreduce_ms": 30.0,
    "optimizer_ms": 4.0, "activation_mb": 1.0,
}
META_MTBF_HOURS = 50_000.0
"""Per-GPU mean time between interruptions from Llama 3's 419 in 54 days on 16,384 GPUs
(16,384 x 54 x 24 / 419 = 50,680 GPU-hours), rounded."""


def register(subparsers: argparse._SubParsersAction) -> None:
    p = _add(subparsers, "bench", "Compare fault-tolerance strategies on a job under failures.",
             "Simulates adaptive re-routing (this planner), dropping failed pipelines, Oobleck-style "
             "re-instantiation, Bamboo-style redundancy and checkpoint-restart on the same job spec and op "
             "costs, for failure sweeps and a failure trace; writes markdown tables, JSON and PNG plots "
             "to DIR. Models and defaults: docs/evaluation.md.")
    p.add_argument("--suite", choices=SUITES,
                   help="tiny: 4x4x8, seconds; gpt-8x8x24: the 1.5B job, 0..4 failures and a day at a "
                        "stressed failure rate; scale: GPT-3-like jobs on 64..4,096 GPUs, 0..10%% failed; "
                        "day-4096: a 4,096-GPU day under Poisson failures (default gpt-8x8x24, or none "
                        "with --job)")
    p.add_argument("--job", metavar="JOB.json", help="your own job spec instead of a suite")
    p.add_argument("-o", "--output", metavar="DIR", required=True, help="folder for tables and plots")
    p.add_argument("--fail-counts", metavar="N,N,...", help="failure-set sizes to sweep (default 0,1,2,3,4)")
    p.add_argument("--patterns", metavar="P,P,...", default="spread,stage,pipeline",
                   help="where failures sit: spread, stage (concentrated), pipeline (concentrated)")
    p.add_argument("--strategies", metavar="S,S,...", default="adaptive,drop,oobleck,bamboo,checkpoint",
                   help="strategies to compare (default all five)")
    t = p.add_argument_group("failure trace (a day by default for --job; day suites set their own)")
    t.add_argument("--trace", metavar="FILE.csv", help="events as time_s,pipeline,stage,fail|rejoin")
    t.add_argument("--hours", type=float, help="length of the simulated run (default 24)")
    t.add_argument("--mtbf-hours", type=float, help=f"Poisson: mean hours between failures per GPU "
                                                     f"(default {META_MTBF_HOURS:g}, from Llama 3)")
    t.add_argument("--repair-hours", type=float,
                   help="Poisson: hours until a failed worker rejoins (default 4)")
    t.add_argument("--seed", type=int, default=0, help="Poisson trace seed (default 0)")
    t.add_argument("--no-trace", action="store_true", help="skip the trace simulation")
    t.add_argument("--precompute-k", type=int, default=1, metavar="K",
                   help="the plan store holds every class of up to K failures (default 1)")
    t.add_argument("--bin-minutes", type=float, default=15.0, help="throughput-over-time bins (default 15)")
    m = p.add_argument_group("model parameters (docs/evaluation.md says where the defaults come from)")
    m.add_argument("--detect-s", type=float, default=10.0, help="failure detection, every strategy")
    m.add_argument("--regroup-s", type=float, default=5.0, help="communicator rebuild per event")
    m.add_argument("--oobleck-copy-s", type=float, default=10.0, help="Oobleck layer/optimizer copy")
    m.add_argument("--restart-s", type=float, default=300.0, help="relaunch and checkpoint load")
    m.add_argument("--checkpoint-interval-s", type=float, default=1800.0, help="time between checkpoints")
    m.add_argument("--oobleck-min-stages", type=int, help="shortest Oobleck pipeline (default ceil(S/2))")
    m.add_argument("--baseline-schedule", choices=("1f1b", "planner"), default="1f1b",
                   help="schedule of the Oobleck- and Bamboo-style pipelines: their engines' 1F1B with an "
                   "unsplit backward (default), or this project's B/W-split plan (favourable to them)")
    m.add_argument("--bamboo-slot", choices=("w", "f"), default="w",
                   help="Bamboo's redundant forward: w = movable like W (default), f = fused into F")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.set_defaults(run=_guarded(cmd_bench))


def _csv(text: str, option: str, allowed: tuple[str, ...]) -> list[str]:
    items = [x.strip() for x in text.split(",") if x.strip()]
    bad = [x for x in items if x not in allowed]
    if not items or bad:
        raise CliError(f"{option}: expected a comma-separated subset of {','.join(allowed)}, "
                       f"got {text!r}")
    return list(dict.fromkeys(items))


def _counts(text: str) -> list[int]:
    try:
        counts = sorted({int(x) for x in text.split(",") if x.strip()})
    except ValueError:
        raise CliError(f"--fail-counts: expected comma-separated integers, got {text!r}") from None
    if not counts or counts[0] < 0:
        raise CliError(f"--fail-counts: expected integers >= 0, got {text!r}")
    return counts


def _check_options(args: argparse.Namespace) -> None:
    for name in ("detect_s", "regroup_s", "oobleck_copy_s", "restart_s"):
        v = getattr(args, name)
        if not (math.isfinite(v) and v >= 0):
            raise CliError(f"--{name.replace('_', '-')}: must be a number >= 0, got {v}")
    for name in ("checkpoint_interval_s", "bin_minutes"):
        v = getattr(args, name)
        if not (math.isfinite(v) and v > 0):
            raise CliError(f"--{name.replace('_', '-')}: must be a number > 0, got {v}")
    for name, low in (("hours", 0.0), ("mtbf_hours", 0.0), ("repair_hours", None)):
        v = getattr(args, name)
        if v is not None and not (math.isfinite(v) and (v > low if low is not None else v >= 0)):
            bound = f"> {low:g}" if low is not None else ">= 0"
            raise CliError(f"--{name.replace('_', '-')}: must be a number {bound}, got {v}")
    if args.precompute_k < 0:
        raise CliError(f"--precompute-k: must be >= 0, got {args.precompute_k}")
    if args.oobleck_min_stages is not None and args.oobleck_min_stages < 1:
        raise CliError(f"--oobleck-min-stages: must be >= 1, got {args.oobleck_min_stages}")
    if args.suite and args.job:
        raise CliError("--suite and --job: choose one (a suite brings its own jobs)")
    if args.trace and (args.mtbf_hours is not None or args.repair_hours is not None):
        raise CliError("--trace and --mtbf-hours/--repair-hours: a trace file replaces the Poisson trace")


def _suite(args: argparse.Namespace) -> dict:
    """Jobs, sweep points and trace settings of the chosen suite (or of --job)."""
    from evaluation import scale
    from planner.spec import JobSpec

    patterns = _csv(args.patterns, "--patterns", scale.PATTERNS)
    counts = _counts(args.fail_counts) if args.fail_counts else [0, 1, 2, 3, 4]
    name = args.suite or ("job" if args.job else "gpt-8x8x24")
    trace = {"hours": 24.0, "mtbf_hours": META_MTBF_HOURS, "repair_hours": 4.0}
    if name == "job":
        jobs = {Path(args.job).stem: load_job(args.job)}
    elif name == "tiny":
        jobs = {"uniform-4x4x8": JobSpec.parse(_UNIFORM_4X4X8)}
        counts = _counts(args.fail_counts) if args.fail_counts else [0, 1, 2, 3]
        trace = {"hours": 6.0, "mtbf_hours": 40.0, "repair_hours": 1.0}
    elif name == "gpt-8x8x24":
        jobs = {"gpt-1.5b": JobSpec.parse(_GPT_1_5B_8X8X24)}
        trace = {"hours": 24.0, "mtbf_hours": 500.0, "repair_hours": 4.0}  # stressed: ~3 failures a day
    elif name == "scale":
        jobs = {f"gpt3-{g}": scale.gpt3_job(*shape) for g, shape in scale.SCALE_SHAPES.items()}
        trace = None
    else:
        jobs = {"gpt3-4096": scale.gpt3_job(*scale.SCALE_SHAPES[4096])}
        counts = []
    points = []
    for label, job in jobs.items():
        if name == "scale":
            points += scale.fraction_points(label, job, [0.0, 0.01, 0.02, 0.05, 0.10], patterns)
        else:
            points += scale.count_points(label, job, counts, patterns)
    if args.no_trace:
        trace = None
    elif trace is not None or args.trace or args.hours or args.mtbf_hours:
        trace = dict(trace or {"hours": 24.0, "mtbf_hours": META_MTBF_HOURS, "repair_hours": 4.0})
        for key in ("hours", "mtbf_hours", "repair_hours"):
            if getattr(args, key) is not None:
                trace[key] = getattr(args, key)
    return {"name": name, "jobs": jobs, "points": points, "trace": trace}


def cmd_bench(args: argparse.Namespace) -> int:
    from evaluation import report
    from evaluation.strategies import STRATEGY_NAMES, Evaluator, PauseModel
    from evaluation.trace import TraceError, poisson_trace, read_trace, simulate_day

    _check_options(args)
    strategies = _csv(args.strategies, "--strategies", STRATEGY_NAMES)
    suite = _suite(args)
    out = Path(args.output)
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"--output {out}: cannot create the folder ({exc})") from None
    pauses = PauseModel(args.detect_s, args.regroup_s, args.oobleck_copy_s, args.restart_s,
                        args.checkpoint_interval_s)
    evaluators = {label: Evaluator(job, pauses, args.oobleck_min_stages, args.bamboo_slot,
                                        args.baseline_schedule)
                  for label, job in suite["jobs"].items()}
    progress = not args.no_progress
    terminal: list[str] = []
    started = time.perf_counter()
    summary = [f"# recycle bench: suite `{suite['name']}`\n",
               "Throughput = the full global batch (D x M micro-batches) per iteration time. Models and "
               "assumptions: docs/evaluation.md.\n"]
    record: dict = {"suite": suite["name"], "strategies": strategies, "pauses": pauses.as_json(),
                    "oobleck_min_stages": args.oobleck_min_stages, "bamboo_slot": args.bamboo_slot,
                    "baseline_schedule": args.baseline_schedule,
                    "jobs": {k: j.filled() for k, j in suite["jobs"].items()}}

    if suite["points"]:
        from evaluation.scale import run_sweep

        rows = run_sweep(suite["points"], strategies, evaluators, progress)
        (out / "sweep.md").write_text(report.sweep_markdown(rows, strategies), encoding="utf-8")
        report.write_json(out / "sweep.json", {**record, "rows": rows})
        report.plot_sweep(rows, strategies, out / "sweep.png")
        summary += ["## Throughput under failure sets (micro-batches/s)\n",
                    report.sweep_markdown(rows, strategies)]
        terminal.append(report.headline_text(rows, strategies))

    label, job = next(iter(suite["jobs"].items()))
    if job.op_count <= GANTT_MAX_OPS and "adaptive" in strategies:
        from evaluation.scale import failure_set, max_failures
        from planner.solve import plan

        failed = failure_set(job, min(2, max_failures(job)), "spread")
        report.write_gantt(plan(job, failed, use_cp=False), out / "gantt.png")
        summary.append(f"Gantt chart of the adapted plan of {label} with {list(map(list, failed))} failed: "
                       "gantt.png (re-routed micro-batches hatched).\n")

    if suite["trace"] is not None:
        ev = evaluators[label]
        t = suite["trace"]
        try:
            if args.trace:
                events = read_trace(args.trace, job)
                source = f"trace file {args.trace}"
            else:
                events = poisson_trace(job, t["hours"], t["mtbf_hours"], t["repair_hours"], args.seed)
                source = (f"Poisson: MTBF {t['mtbf_hours']:g} h per GPU, repair {t['repair_hours']:g} h, "
                          f"seed {args.seed}")
        except TraceError as exc:
            raise CliError(str(exc)) from None
        duration = t["hours"] * 3600.0
        day_started = time.perf_counter()
        days, lookups = simulate_day(ev, events, duration, strategies, args.precompute_k, progress)
        day_wall = time.perf_counter() - day_started
        fault_free_rate = job.pipelines * job.microbatches / (ev.fault_free_ms() / 1000.0)
        bin_s = args.bin_minutes * 60.0
        report.plot_day(days, duration, bin_s, out / "day.png", fault_free_rate)
        fails = sum(e.kind == "fail" for e in events)
        text = (f"## {t['hours']:g} hours of {label} ({job.pipelines * job.stages} GPUs)\n\n{source}: "
                f"{fails} failures, {len(events) - fails} rejoins; simulated in {day_wall:.1f} s.\n\n"
                + report.day_markdown(days, duration, fault_free_rate)
                + "\nAdaptive plan lookups:\n\n" + report.lookups_markdown(lookups)
                + "\nTime in each plan:\n\n" + report.plan_time_markdown(days))
        (out / "day.md").write_text(text, encoding="utf-8")
        report.write_json(out / "day.json", {
            **record, "trace": source, "events": len(events), "failures": fails, "hours": t["hours"],
            "wall_s": round(day_wall, 2), "fault_free_mb_s": fault_free_rate, "lookups": lookups.as_json(),
            "days": {n: {"useful_microbatches": d.useful_microbatches(), "restarts": d.restarts,
                         "lost_s": d.lost_s, "time_in_plan_s": d.time_in_plan_s,
                         "binned_mb_s": d.binned(duration, bin_s)} for n, d in days.items()},
        })
        summary.append(text)
        terminal.append(f"{t['hours']:g} hours of {label}, {source}: {fails} failures, "
                        f"{len(events) - fails} rejoins; useful throughput over the run:\n"
                        + report.day_text(days, duration, fault_free_rate))

    wall = time.perf_counter() - started
    summary.append(f"\nWall time {wall:.1f} s; adaptive planning "
                   f"{sum(e.plan_seconds for e in evaluators.values()):.1f} s of it.\n")
    (out / "summary.md").write_text("\n".join(summary), encoding="utf-8")
    print(f"recycle bench, suite {suite['name']} (models and assumptions: docs/evaluation.md)\n")
    print("\n".join(terminal))
    print(f"wrote {', '.join(sorted(p.name for p in out.iterdir()))} to {out} in {wall:.1f} s")
    return 0
