"""`recycle plan | simulate | precompute`: the planner's command line (precompute: cli/precompute.py).

`register` only defines arguments (cli/main.py imports it for every `recycle` call, `--help`
included); the planner, numpy and matplotlib are imported inside the commands. Bad input never
ends in a traceback: `_guarded` turns every input error into one line on stderr and exit code 2,
and argparse's own errors are shortened to one line too. Exit codes: 0 ok, 1 an invalid plan
(simulate) or an unplannable class (precompute), 2 bad input.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from cli.timeline_text import compact_json, timeline_chunks

EXIT_OK, EXIT_INVALID, EXIT_INPUT = 0, 1, 2
FORMATS = ("timeline", "chrome", "csv", "gantt", "summary")


class CliError(Exception):
    """Bad input: printed as one line, exit code 2."""


# ------------------------------------------------------------------------------------ registration


def register(subparsers: argparse._SubParsersAction) -> None:
    p = _add(subparsers, "plan", "Plan one training iteration for a job and a failure set.",
             "Plans with the list-scheduling heuristic, then CP-SAT (unless --no-cp) within the time "
             "limit, checks the plan against the contract's six validity rules, writes it in the chosen "
             "format and prints a one-screen summary to stderr.")
    p.add_argument("job", metavar="JOB.json", help="job spec (shared/docs/contracts.md)")
    p.add_argument("--fail", metavar="P:S", action="append", default=[],
                   help="a failed worker as pipeline:stage; repeat the option or separate with commas "
                        "(e.g. --fail 0:3 --fail 2:3 or --fail 0:3,2:3)")
    _solver_options(p)
    p.add_argument("--seed", type=int, default=0, help="CP-SAT random seed (default 0)")
    p.add_argument("--format", choices=FORMATS, default="timeline",
                   help="timeline: recycle.timeline/v1 JSON (default); chrome: Chrome/Perfetto trace "
                        "JSON; csv: torch.distributed.pipelining compute-only CSV (no failures only); "
                        "gantt: PNG chart (needs -o); summary: the solver summary as JSON")
    p.add_argument("-o", "--output", metavar="FILE", help="write here instead of stdout")
    p.set_defaults(run=_guarded(cmd_plan))

    s = _add(subparsers, "simulate", "Validate and replay a plan timeline.",
             "Reads a recycle.timeline/v1 JSON from any tool, checks the six validity rules (listing "
             "every violation), replays the op orders to measure the steady-state period, and prints "
             "per-worker busy/idle time and peak memory. Exit code 1 if the plan is invalid.")
    s.add_argument("plan", metavar="PLAN.json", help="plan timeline (recycle.timeline/v1)")
    s.add_argument("--jitter", type=float, default=0.0, metavar="X",
                   help="also replay with every op lasting its time x U[1-X, 1+X] (0 <= X < 1) and print "
                        "the mean period (default 0: off)")
    s.add_argument("--seed", type=int, default=0, help="random seed of the jittered replay (default 0)")
    s.add_argument("--iterations", type=int, default=40, metavar="N",
                   help="back-to-back iterations to replay (3..10000, default 40)")
    s.set_defaults(run=_guarded(cmd_simulate))

    c = _add(subparsers, "precompute", "Plan every canonical failure class up to K failures.",
             "Enumerates the failure classes (failure sets up to relabelling of pipelines), plans each, "
             "and writes one timeline JSON per class plus DIR/index.json. Classes already in the index "
             "are skipped, so an interrupted run resumes where it stopped. Exit code 1 if some class "
             "could not be planned.")
    c.add_argument("job", metavar="JOB.json", help="job spec (shared/docs/contracts.md)")
    c.add_argument("--max-failures", type=int, required=True, metavar="K",
                   help="plan failure sets of 0..K workers")
    c.add_argument("-o", "--output", metavar="DIR", required=True, help="directory for the plans")
    _solver_options(c)
    c.set_defaults(run=_guarded(_precompute))


def _precompute(args: argparse.Namespace) -> int:
    from cli.precompute import cmd_precompute

    return cmd_precompute(args)


def _add(subparsers, name: str, summary: str, description: str) -> argparse.ArgumentParser:
    parser = subparsers.add_parser(name, help=summary, description=f"{summary} {description}")
    # argparse's own errors (unknown option, missing argument) print usage then the error; one line
    # naming the problem is easier to read in a log, and matches the command's other errors.
    parser.error = lambda message, _name=name: _fail_usage(_name, message)  # type: ignore[method-assign]
    return parser


def _solver_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--time-limit", type=float, default=10.0, metavar="SEC",
                        help="planning time limit per plan in seconds (default 10)")
    parser.add_argument("--no-cp", action="store_true",
                        help="heuristic only: skip the CP-SAT improvement step (fast, deterministic)")


def _fail_usage(name: str, message: str) -> NoReturn:
    print(f"recycle {name}: error: {message} (see recycle {name} --help)", file=sys.stderr)
    raise SystemExit(EXIT_INPUT)


def _guarded(command: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        from planner.spec import SpecError

        try:
            return command(args)
        except (CliError, SpecError) as exc:
            print(f"recycle {args.command}: error: {exc}", file=sys.stderr)
            return EXIT_INPUT

    return run


# ------------------------------------------------------------------------------------ input helpers


def load_json(path: str, what: str) -> Any:
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise CliError(f"{what} {path}: no such file") from None
    except IsADirectoryError:
        raise CliError(f"{what} {path}: is a directory, expected a JSON file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CliError(f"{what} {path}: cannot read ({exc})") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} {path}: invalid JSON at line {exc.lineno} column {exc.colno}: {exc.msg}") \
            from None


def load_job(path: str):
    from planner.spec import JobSpec, SpecError

    data = load_json(path, "job")
    try:
        return JobSpec.parse(data)
    except SpecError as exc:
        raise CliError(f"job {path}: invalid job spec: {exc}") from None


def parse_fail_options(values: list[str]) -> list[tuple[int, int]]:
    """`["0:3", "1:2,2:2"]` -> [(0, 3), (1, 2), (2, 2)]; range checks happen against the job."""
    workers = []
    for value in values:
        for item in value.split(","):
            text = item.strip()
            head, sep, tail = text.partition(":")
            if not sep or not head.strip().isdigit() or not tail.strip().isdigit():
                raise CliError(f"--fail {text!r}: expected PIPELINE:STAGE with two non-negative integers, "
                               "e.g. --fail 0:3")
            workers.append((int(head), int(tail)))
    return workers


def check_time_limit(seconds: float) -> float:
    if not math.isfinite(seconds) or seconds <= 0:
        raise CliError(f"--time-limit: must be a positive number of seconds, got {seconds}")
    return seconds


def write_output(path: str | None, data) -> None:
    """Write text, bytes, or text in pieces (an iterator of str: a large timeline, never joined)."""
    if not isinstance(data, (str, bytes)):
        if path is None:
            sys.stdout.writelines(data)
            sys.stdout.write("\n")
            return
        try:
            with open(path, "w", encoding="utf-8") as out:
                out.writelines(data)
        except OSError as exc:
            raise CliError(f"-o {path}: cannot write ({exc.strerror or exc})") from None
        return
    if path is None:
        if isinstance(data, bytes):
            raise CliError("binary output needs -o FILE")
        sys.stdout.write(data if data.endswith("\n") else data + "\n")
        return
    try:
        if isinstance(data, bytes):
            Path(path).write_bytes(data)
        else:
            Path(path).write_text(data, encoding="utf-8")
    except OSError as exc:
        raise CliError(f"-o {path}: cannot write ({exc.strerror or exc})") from None


def _workers_text(workers) -> str:
    return " ".join(f"[{p},{s}]" for p, s in workers) or "none"


# ------------------------------------------------------------------------------------------- plan


def cmd_plan(args: argparse.Namespace) -> int:
    job = load_job(args.job)
    failed = parse_fail_options(args.fail)
    time_limit = check_time_limit(args.time_limit)
    if args.seed < 0:
        raise CliError(f"--seed: must be >= 0, got {args.seed}")
    if args.format == "gantt" and not args.output:
        raise CliError("--format gantt writes a PNG: give -o FILE.png")
    from planner.failures import parse_failure_set
    from planner.spec import SpecError

    try:
        failed = parse_failure_set(job, failed)
    except SpecError as exc:  # names the worker out of range or the stage left without a survivor
        raise CliError(f"--fail: {str(exc).removeprefix('failed: ')}") from None
    if args.format == "csv" and failed:
        raise CliError("--format csv: torch.distributed.pipelining cannot express re-routed "
                       "micro-batches; plan without --fail for a CSV")

    from planner.solve import plan

    result = plan(job, failed, time_limit_s=time_limit, use_cp=not args.no_cp, seed=args.seed)
    if args.format == "summary":
        output: Any = json.dumps({"failed": [list(w) for w in result.failed],
                                          **result.summary_json()}, indent=2)
    elif args.format == "timeline":
        output = timeline_chunks(result)
    else:
        timeline = result.timeline_json()
        if args.format == "chrome":
            from planner.export.chrome import chrome_trace

            output = compact_json(chrome_trace(timeline))
        elif args.format == "csv":
            from planner.export.pipelining_csv import pipelining_csv

            output = pipelining_csv(timeline)
        else:
            from planner.export.gantt import gantt_png

            output = gantt_png(timeline)
    write_output(args.output, output)
    print(plan_summary(result, args.output, args.format), file=sys.stderr)
    return EXIT_OK


def plan_summary(result, output: str | None, fmt: str) -> str:
    job, stats = result.job, result.stats
    lines = [
        f"job {job.pipelines}x{job.stages}x{job.microbatches} (pipelines x stages x micro-batches), "
        f"failed {_workers_text(result.failed)}, failure class {result.canonical.key}",
        f"iteration {result.iteration_ms:.3f} ms | fault-free {result.fault_free_iteration_ms:.3f} ms "
        f"(x{result.iteration_ms / result.fault_free_iteration_ms:.4f}) "
        f"| bound {result.lower_bound_ms:.3f} ms | gap {100 * result.gap:.2f}%",
        f"status {stats.status.value} (heuristic {stats.heuristic_policy}, "
        f"cp {stats.cp_status or 'not run'}) | {len(result.ops)} ops | wall {stats.wall_s:.2f} s",
    ]
    if output:
        lines.append(f"wrote {fmt} to {output}")
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------- simulate


MAX_VIOLATIONS_SHOWN = 200
FULL_TABLE_MAX_WORKERS = 64


def load_timeline(path: str):
    """(job, failed, ops, stated iteration_ms) from a timeline file; CliError names what is wrong."""
    from pydantic import ValidationError

    from planner.failures import parse_failure_set
    from planner.spec import JobSpec, SpecError
    from planner.timeline import Timeline

    data = load_json(path, "plan")
    if not isinstance(data, dict):
        raise CliError(f"plan {path}: expected a JSON object (recycle.timeline/v1)")
    if "ops" not in data and {"pipelines", "stages", "microbatches"} <= data.keys():
        raise CliError(f"plan {path}: this is a job spec, not a plan timeline; plan it first: "
                       f"recycle plan {path} [--fail P:S ...] -o plan.json, then recycle simulate plan.json")
    try:
        timeline = Timeline.model_validate(data)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "document"
        raise CliError(f"plan {path}: not a recycle.timeline/v1 document: {where}: {first['msg']} "
                       f"({exc.error_count()} problem(s))") from None
    try:
        job = JobSpec.parse(timeline.job)
    except SpecError as exc:
        raise CliError(f"plan {path}: invalid job spec in 'job': {exc}") from None
    try:
        failed = parse_failure_set(job, timeline.failed)
    except SpecError as exc:
        raise CliError(f"plan {path}: {exc}") from None
    return job, failed, timeline.internal_ops(), timeline.iteration_ms


def cmd_simulate(args: argparse.Namespace) -> int:
    if not (math.isfinite(args.jitter) and 0 <= args.jitter < 1):
        raise CliError(f"--jitter: must be in [0, 1), got {args.jitter}")
    if not 3 <= args.iterations <= 10_000:
        raise CliError(f"--iterations: must be in 3..10000, got {args.iterations}")
    if args.seed < 0:
        raise CliError(f"--seed: must be >= 0, got {args.seed}")
    job, failed, ops, stated_ms = load_timeline(args.plan)

    from planner.simulator import ReplayError, replay
    from planner.validate import peak_memory, validate

    violations = validate(job, failed, ops)
    out = [f"plan {args.plan}: job {job.pipelines}x{job.stages}x{job.microbatches}, "
           f"failed {_workers_text(failed)}, {len(ops)} ops"]
    if violations:
        out.append(f"INVALID: {len(violations)} violation(s)")
        out += [f"  {v}" for v in violations[:MAX_VIOLATIONS_SHOWN]]
        if len(violations) > MAX_VIOLATIONS_SHOWN:
            out.append(f"  ... and {len(violations) - MAX_VIOLATIONS_SHOWN} more")
    else:
        out.append("valid: all six rules hold")
    try:
        report = replay(job, ops, iterations=args.iterations)
    except Exception as exc:
        # An invalid plan may lack the ops a replay needs, name stages the job lacks, or deadlock;
        # that is part of the report. A valid plan that cannot be replayed is a planner bug: raise.
        if not violations and not isinstance(exc, ReplayError):
            raise
        detail = f"missing op {exc}" if isinstance(exc, KeyError) else f"{type(exc).__name__}: {exc}"
        out.append(f"period: cannot replay this plan ({detail})")
        print("\n".join(out))
        return EXIT_INVALID
    agrees = abs(report.iteration_ms - stated_ms) <= 1e-6 * max(1.0, stated_ms)
    out.append(f"period (replayed) {report.iteration_ms:.3f} ms; the plan states {stated_ms:.3f} ms"
               + ("" if agrees else "  <- DIFFERS"))
    if args.jitter:
        jittered = replay(job, ops, iterations=args.iterations, jitter=args.jitter, seed=args.seed)
        out.append(f"period with +/-{100 * args.jitter:g}% jitter (seed {args.seed}, "
                   f"{args.iterations} iterations): {jittered.iteration_ms:.3f} ms "
                   f"(x{jittered.iteration_ms / report.iteration_ms:.4f})")
    out += worker_table(job, report, peak_memory(job, ops))
    print("\n".join(out))
    return EXIT_INVALID if violations else EXIT_OK


def worker_table(job, report, peaks: dict) -> list[str]:
    """Per-worker busy/idle/peak rows; per-stage min..max summaries when there are many workers."""
    period = report.iteration_ms
    limit = job.costs.memory_limit_mb
    workers = sorted(report.busy_ms)
    if len(workers) <= FULL_TABLE_MAX_WORKERS:
        rows = [f"{'worker':>10} {'busy ms':>10} {'idle ms':>10} {'busy %':>7} {'peak MB':>9}"]
        for w in workers:
            busy = report.busy_ms[w]
            rows.append(f"{f'[{w[0]}, {w[1]}]':>10} {busy:10.2f} {report.idle_ms[w]:10.2f} "
                        f"{100 * busy / period:7.1f} {peaks.get(w, 0.0):9.1f}")
        rows.append(f"(memory limit {limit:g} MB per worker)")
        return rows
    rows = [f"{len(workers)} workers, summarised per stage (min..max over the stage's alive workers)",
            f"{'stage':>5} {'alive':>5} {'busy ms':>19} {'idle ms':>19} {'peak MB':>15}"]
    for s in range(job.stages):
        ws = [w for w in workers if w[1] == s]
        if not ws:
            continue
        busy = [report.busy_ms[w] for w in ws]
        idle = [report.idle_ms[w] for w in ws]
        peak = [peaks.get(w, 0.0) for w in ws]
        rows.append(f"{s:>5} {len(ws):>5} {min(busy):9.2f}..{max(busy):<9.2f} "
                    f"{min(idle):9.2f}..{max(idle):<9.2f} {min(peak):7.1f}..{max(peak):<7.1f}")
    busiest = max(workers, key=lambda w: report.busy_ms[w])
    rows.append(f"busiest worker [{busiest[0]}, {busiest[1]}]: {report.busy_ms[busiest]:.2f} ms busy of "
                f"{period:.2f} ms; memory limit {limit:g} MB per worker")
    return rows
