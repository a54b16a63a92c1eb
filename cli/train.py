"""`recycle train`: the local cluster a newcomer runs, end to end.

Starts the plan service (`recycle serve` on 127.0.0.1, a free port, SQLite in a temp dir) unless
`--service URL`; registers the job (profiled on this machine, or `--job FILE`); precomputes the
plans of every failure set up to the number of `--kill` flags; launches D x S worker processes
that follow the service's generations; trains with a progress bar; injects the faults; prints a
table (loss, measured vs predicted iteration ms, generation; recovery per failure) and, with
`--report FILE`, writes the same as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
import tempfile
from pathlib import Path
from typing import Any

EXIT_OK, EXIT_FAILED, EXIT_INPUT = 0, 1, 2


def _err(message: str) -> None:
    print(f"recycle train: error: {message}", file=sys.stderr)


def _job_spec(args: argparse.Namespace, model, data, app=None) -> dict[str, Any]:
    from executor.model import ConfigError
    from planner.spec import JobSpec

    if args.job:
        try:
            raw = json.loads(Path(args.job).read_text())
        except OSError as exc:
            raise ConfigError(f"job: cannot read {args.job}: {exc.strerror}", "job") from None
        except json.JSONDecodeError as exc:
            raise ConfigError(f"job: {args.job} is not JSON: {exc}", "job") from None
        job = JobSpec.parse(raw)
        got = (job.pipelines, job.stages, job.microbatches)
        if got != (args.pipelines, args.stages, args.microbatches):
            raise ConfigError(f"job: {args.job} has pipelines/stages/microbatches {list(got)}, the run "
                              f"{[args.pipelines, args.stages, args.microbatches]}", "job")
        return job.filled()
    import torch

    torch.set_num_threads(1)  # as each worker runs (WorkerSpec.threads)
    print(f"profiling the model on this machine's {args.device} ({args.reps} reps per figure) ...",
          file=sys.stderr)
    # On the device the workers train on: a CUDA run planned from CPU timings mispredicts every op.
    if app is not None:
        from executor.app_profile import profile_app

        return profile_app(app, args.pipelines, args.stages, args.microbatches, args.reps, args.device)
    from executor.profile import profile_job

    return profile_job(model, args.pipelines, args.stages, args.microbatches, data, args.reps, args.device)


def check_device(device: str, workers: int) -> None:
    """NCCL cannot put two ranks of one group on one GPU, so a one-host CUDA run needs a GPU per
    worker; say so before starting anything."""
    from executor.model import ConfigError

    if device != "cuda":
        return
    import torch

    if not torch.cuda.is_available():
        raise ConfigError("device: cuda was asked for but torch sees no CUDA device", "device")
    if torch.cuda.device_count() < workers:
        raise ConfigError(f"device: cuda needs one GPU per worker ({workers} workers), this host has "
                          f"{torch.cuda.device_count()}", "device")


def cmd_train(args: argparse.Namespace) -> int:
    from cli.worker import WorkerInputError, check_checkpoint_options, service_token
    from executor.app import AppError, load_app, validate_app
    from executor.cluster import LiveCluster, LiveRunError, check_faults, parse_kill, parse_rejoin
    from executor.data import DataConfig
    from executor.model import ConfigError, ModelConfig
    from executor.service import LocalService, ServiceClient, ServiceError
    from planner.spec import SpecError

    try:
        for name in ("pipelines", "stages", "microbatches", "iterations"):
            if getattr(args, name) < 1:
                raise ConfigError(f"{name}: must be >= 1, got {getattr(args, name)}", name)
        if args.timeout <= 0:
            raise ConfigError(f"timeout: must be > 0, got {args.timeout}", "timeout")
        model = ModelConfig(layers=args.layers, width=args.width, heads=args.heads, vocab=args.vocab,
                            seq_len=args.seq_len, seed=args.seed)
        app = None
        if args.app:  # checked here, before any process starts
            app = load_app(args.app)
            validate_app(app, args.stages)
        else:
            model.stage_layers(args.stages)
        data = DataConfig(batch_size=args.batch_size, text_file=args.text_file)
        faults = [parse_kill(k) for k in args.kill]
        rejoins = [parse_rejoin(r) for r in args.rejoin]
        check_faults(args.pipelines, args.stages, args.iterations, faults, rejoins)
        check_checkpoint_options(args)
        check_device(args.device, args.pipelines * args.stages)
        given_token = service_token(dict(os.environ)) if args.service else None
        spec = _job_spec(args, model, data, app)
    except (ConfigError, SpecError, AppError, WorkerInputError) as exc:
        _err(str(exc))
        return EXIT_INPUT

    with tempfile.TemporaryDirectory(prefix="recycle-train-") as tmp:
        service = None
        try:
            if args.service:
                url, token = args.service, given_token
            else:
                # Authenticated even on loopback: the launcher keeps the admin token and its workers
                # get only the job's worker token, as on a real cluster.
                service = LocalService(Path(tmp), {"RECYCLE_SOLVE_TIME_LIMIT_S": str(args.solve_time_limit),
                                                   "RECYCLE_API_TOKEN": secrets.token_urlsafe(24)})
                url, token = service.start().url, service.token
                print(f"service: {url} (SQLite in {tmp})", file=sys.stderr)
            client = ServiceClient(url, token)
            job_id = client.create_job(spec)
            op = client.precompute(job_id, len(faults), args.precompute_timeout)
            print(f"job {job_id}: precompute of failure sets up to {len(faults)}: {op['status']} "
                  f"({op['done']}/{op['total']})", file=sys.stderr)
            cluster = LiveCluster(url, job_id, args.pipelines, args.stages, args.microbatches,
                                  args.iterations, model, data, faults=faults, rejoins=rejoins,
                                  token=token, timeout_s=args.timeout, app=args.app,
                                  checkpoint_dir=args.checkpoint_dir, checkpoint_every=args.checkpoint_every,
                                  resume=args.resume, stage_lost_wait_s=args.stage_lost_wait,
                                  device=args.device, snapshot_memory=args.snapshot_memory)
            run = _run_with_progress(cluster, args.iterations)
        except (ServiceError, LiveRunError) as exc:
            _err(str(exc))
            return EXIT_FAILED
        finally:
            if service is not None:
                service.stop()
    report = {
        "pipelines": args.pipelines, "stages": args.stages, "microbatches": args.microbatches,
        "iterations": run.iterations,
        "failures": [{k: f[k] for k in ("worker", "iteration", "recovery_ms")} for f in run.failures],
        "stage_parameter_norms": run.stage_parameter_norms(),
        "failure_details": run.failures,
        "generations": run.generations,
        "job_id": job_id,
    }
    if args.check_exact:
        report["exactness"] = _compare_with_reference(args, run, model, data)
    print(render_table(report))
    if args.report:
        try:
            Path(args.report).write_text(json.dumps(report, indent=2) + "\n")
        except OSError as exc:
            _err(f"cannot write {args.report}: {exc.strerror}")
            return EXIT_INPUT
        print(f"wrote {args.report}", file=sys.stderr)
    return EXIT_OK


def _compare_with_reference(args: argparse.Namespace, run, model, data) -> dict[str, Any]:
    """Train the same model on the same global batches in this one process with no failure, and
    compare every iteration's loss (relative tolerance 1e-5, fp32)."""
    import torch

    torch.set_num_threads(1)
    print("training the same model without failures in one process, to compare ...", file=sys.stderr)
    if args.app:
        from executor.app import load_app
        from executor.reference import train_reference_app

        ref = train_reference_app(load_app(args.app), args.stages, args.pipelines, args.microbatches,
                                  args.iterations)
    else:
        from executor.reference import train_reference

        ref = train_reference(model, args.stages, args.pipelines, args.microbatches, args.iterations, data)
    got = [r["loss"] for r in run.iterations]
    worst = max((abs(a - b) / max(abs(b), 1e-12) for a, b in zip(got, ref.losses, strict=True)), default=0.0)
    return {"reference_losses": ref.losses, "max_relative_difference": worst,
            "equal": len(got) == len(ref.losses) and worst <= 1e-5}


def _run_with_progress(cluster, iterations: int):
    from tqdm import tqdm

    with tqdm(total=iterations, desc="training", unit="it", file=sys.stderr) as bar:
        def advance(done: int) -> None:
            bar.update(done - bar.n)

        return cluster.run(progress=advance)


def _events(report: dict[str, Any]) -> dict[int, list[str]]:
    """Per iteration, the kills that landed in it and the rejoins that started with it."""
    events: dict[int, list[str]] = {}
    for f in report["failure_details"]:
        events.setdefault(f["iteration"], []).append(f"worker {f['worker'][0]}:{f['worker'][1]} killed "
                                                      f"({f['phase']})")
    killed = [f["worker"] for f in report["failure_details"]]
    was_failed: list[list[int]] = []
    back: list[list[int]] = []
    for g in report["generations"][1:]:
        # A killed worker is back once alive again after being failed, or in the generation that
        # restored a lost stage (the generations while it was failed ran nothing, so none is recorded).
        for w in killed:
            if w not in back and w not in g["failed"] and (w in was_failed or g.get("restored") is not None):
                back.append(w)
                events.setdefault(g["restart"], []).append(f"worker {w[0]}:{w[1]} rejoined")
        if g.get("restored") is not None:
            step = g["restored"]
            events.setdefault(g["restart"], []).append(
                "a stage had lost every worker: all restored " + (f"checkpoint step-{step}" if step
                                                                  else "the initial state"))
        was_failed += g["failed"]
    return events


def measured_vs_predicted(iterations: list[dict[str, Any]], workers: int, cores: int) -> str:
    """One line saying which way measured and predicted differ (median ratio) and why they can."""
    ratios = sorted(r["iteration_ms"] / r["predicted_ms"] for r in iterations if r.get("predicted_ms"))
    if not ratios:
        return "measured vs predicted: no prediction (no plan timing for these iterations)"
    ratio = ratios[len(ratios) // 2]
    if ratio < 1:
        why = ("the run was faster than its profile, which was measured once, under the machine's load "
               "at that moment")
    elif workers > cores:
        why = f"here {workers} worker processes share {cores} CPU cores, which the profile did not"
    else:
        why = ("the run also waits on the service and its peers and writes any checkpoints, which the "
               "profile does not time")
    return (f"measured vs predicted: median {ratio:.2f}x (the plan predicts from a profile of each "
            f"stage run alone; {why})")


def render_table(report: dict[str, Any]) -> str:
    events = _events(report)
    lines = ["workers are named P:S = pipeline:stage",
             f"{'iteration':>9}  {'loss':>9}  {'measured ms':>11}  {'predicted ms':>12}  "
             f"{'generation':>10}  event"]
    for r in report["iterations"]:
        predicted = f"{r['predicted_ms']:.2f}" if r["predicted_ms"] is not None else "-"
        note = "; ".join(events.get(r["iteration"], []))
        lines.append(f"{r['iteration']:>9}  {r['loss']:>9.5f}  {r['iteration_ms']:>11.1f}  {predicted:>12}  "
                     f"{r['generation']:>10}  {note}".rstrip())
    workers = report.get("pipelines", 0) * report.get("stages", 0)
    if workers:
        lines.append(measured_vs_predicted(report["iterations"], workers, os.cpu_count() or 1))
    if report["failure_details"]:
        head = f"{'failure':>9}  {'iteration':>9}  {'phase':>15}  {'detected ms':>11}  {'recovery ms':>11}"
        lines += ["", head]
        for f in report["failure_details"]:
            rec = f"{f['recovery_ms']:.1f}" if f["recovery_ms"] is not None else "-"
            det = f"{f['detected_ms']:.1f}" if f["detected_ms"] is not None else "-"
            lines.append(f"{f['worker'][0]}:{f['worker'][1]:<7}  {f['iteration']:>9}  {f['phase']:>15}  "
                         f"{det:>11}  {rec:>11}")
    norms = ", ".join(f"{n:.4f}" for n in report["stage_parameter_norms"])
    lines += ["", f"stage parameter norms: {norms}"]
    lines += [f"generation {g['generation']}: failed {g['failed']}, started at iteration {g['restart']}"
              + (f" from checkpoint step-{g['restored']}" if g.get("restored") else "")
              for g in report["generations"]]
    exact = report.get("exactness")
    if exact is not None:
        lines.append(f"losses equal the failure-free run: {'yes' if exact['equal'] else 'no'} (max relative "
                     f"difference {exact['max_relative_difference']:.1e} over "
                     f"{len(exact['reference_losses'])} iterations, single-process reference)")
    return "\n".join(lines)
