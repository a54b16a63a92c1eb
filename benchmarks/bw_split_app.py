"""B/W split cost for a training app: T_B + T_W against one full backward of the same stage.

Per stage of the app (default: the GPT example split in 3, so stage 1 is a middle stage with a
differentiable input): F then one ordinary `torch.autograd.backward` over the input and every
parameter, against F then B + W through the workers' own `AppStageRunner`: with its stock weight
layers swapped for deferred-weight-gradient ones (executor/deferred_modules, what workers run) and,
for comparison, with the generic graph split alone (executor/autograd_split, `generic_*`). F is
timed too: the swapped layers' forward is Python, the ordinary one is not. Rounds alternate the
variants in a shuffled order so machine noise and cache warmth favour none; medians and ratios of medians.
On CPU the clock is the process's CPU time (`time.process_time`), so time spent descheduled by
other processes on a shared machine does not count; on CUDA it is wall time around synchronizes.

    python benchmarks/bw_split_app.py [--app examples.gpt:app --stages 3 --reps 30 --device cpu]

Environment knobs of the GPT example: RECYCLE_GPT_LAYERS / _WIDTH / _SEQ (e.g. 6, 256, 128).
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import torch

from executor.app import as_tuple, build_stage, call_stage, load_app
from executor.app_stage import AppStageRunner, to_device


def stage_inputs(app, stages: int, device: torch.device):
    x, target = app.microbatch(0, 0, 1)
    x, target = to_device(x, device), to_device(target, device)
    inputs, value = [], x
    for s in range(stages):
        inputs.append(value if s == 0 else tuple(t.detach() for t in as_tuple(value)))
        module = build_stage(app, s, stages).to(device)
        with torch.no_grad():
            value = module(value) if s == 0 else call_stage(module, inputs[-1])
    return inputs, target


def measure(app, stage: int, stages: int, x, target, reps: int, device: torch.device) -> dict:
    clock = time.process_time if device.type == "cpu" else time.perf_counter
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    last = stage == stages - 1
    module = build_stage(app, stage, stages).to(device)
    swapped = AppStageRunner(module, app, stage, stages, 1.0)
    generic_module = build_stage(app, stage, stages).to(device)
    generic = AppStageRunner(generic_module, app, stage, stages, 1.0, swap_layers=False)

    def full() -> tuple[float, float]:
        t0 = clock()
        ins = x if stage == 0 else tuple(t.detach().requires_grad_(t.dtype.is_floating_point) for t in x)
        out = module(ins) if stage == 0 else call_stage(module, ins)  # not recording: ordinary layers
        roots = [app.loss(out, target)] if last else list(as_tuple(out))
        sync()
        t1 = clock()
        torch.autograd.backward(roots, [torch.ones_like(r) for r in roots])
        sync()
        return t1 - t0, clock() - t1

    def split(runner: AppStageRunner, i: int) -> tuple[float, float, float]:
        t0 = clock()
        out = runner.forward((0, i), x, target if last else None)
        sync()
        t1 = clock()
        grads = None if last else tuple(torch.ones_like(t) for t in out if t.dtype.is_floating_point)
        t2 = clock()
        runner.backward_input((0, i), grads)
        sync()
        t3 = clock()
        runner.backward_weight((0, i))
        sync()
        return t1 - t0, t3 - t2, clock() - t3

    rows: dict[str, list[float]] = {k: [] for k in ("F", "full", "swF", "swB", "swW", "gB", "gW")}
    order = random.Random(stage)
    for i in range(reps + 3):
        results = {}
        for name in order.sample(["full", "swapped", "generic"], 3):
            results[name] = full() if name == "full" else split(swapped if name == "swapped" else generic, i)
        (f, b), sw, g = results["full"], results["swapped"], results["generic"]
        module.zero_grad(set_to_none=True)
        generic_module.zero_grad(set_to_none=True)
        if i >= 3:
            for key, value in zip(rows, (f, b, *sw, *g[1:]), strict=True):
                rows[key].append(value)
    med = {k: statistics.median(v) * 1e3 for k, v in rows.items()}
    return {"stage": stage, "F_ms": round(med["F"], 3), "F_swapped_ms": round(med["swF"], 3),
            "full_ms": round(med["full"], 3), "B_ms": round(med["swB"], 3), "W_ms": round(med["swW"], 3),
            "ratio_B_plus_W_to_full": round((med["swB"] + med["swW"]) / med["full"], 3),
            "generic_B_ms": round(med["gB"], 3), "generic_W_ms": round(med["gW"], 3),
            "generic_ratio": round((med["gB"] + med["gW"]) / med["full"], 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", default="examples.gpt:app")
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    app = load_app(args.app)
    inputs, target = stage_inputs(app, args.stages, device)
    rows = [measure(app, s, args.stages, inputs[s], target, args.reps, device) for s in range(args.stages)]
    print(json.dumps({"app": args.app, "stages": args.stages, "device": args.device,
                      "threads": args.threads,
                      "clock": "process CPU time" if device.type == "cpu" else "wall",
                      "torch": torch.__version__,
                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
