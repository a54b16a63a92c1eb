"""B/W split cost for a training app: T_B + T_W against one full backward of the same stage.

Per stage of the app (default: the GPT example split in 3, so stage 1 is a middle stage with a
differentiable input): F then one ordinary `torch.autograd.backward` over the input and every
parameter, against F then B + W through the workers' own `AppStageRunner` (executor/autograd_split).
Rounds alternate the two variants so machine noise hits both; medians and the ratio of medians.
On CPU the clock is the process's CPU time (`time.process_time`), so time spent descheduled by
other processes on a shared machine does not count; on CUDA it is wall time around synchronizes.

    python benchmarks/bw_split_app.py [--app examples.gpt:app --stages 3 --reps 30 --device cpu]
                                      [--glibc-default-malloc]

On CPU the process keeps freed memory in its heap as every CPU worker does
(executor/host_memory.py); `--glibc-default-malloc` measures glibc's defaults instead.

Environment knobs of the GPT example: RECYCLE_GPT_LAYERS / _WIDTH / _SEQ (e.g. 6, 256, 128).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

from executor.app import as_tuple, build_stage, call_stage, load_app
from executor.app_stage import AppStageRunner, to_device
from executor.host_memory import keep_freed_host_memory


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
    module = build_stage(app, stage, stages).to(device)
    last = stage == stages - 1
    runner = AppStageRunner(module, app, stage, stages, 1.0)
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)

    def full() -> float:
        ins = x if stage == 0 else tuple(t.detach().requires_grad_(t.dtype.is_floating_point) for t in x)
        out = module(ins) if stage == 0 else call_stage(module, ins)
        roots = [app.loss(out, target)] if last else list(as_tuple(out))
        grads = [torch.ones_like(r) for r in roots]
        sync()
        t0 = clock()
        torch.autograd.backward(roots, grads)
        sync()
        return clock() - t0

    def split(i: int) -> tuple[float, float]:
        out = runner.forward((0, i), x, target if last else None)
        grads = None if last else tuple(torch.ones_like(t) for t in out if t.dtype.is_floating_point)
        sync()
        t0 = clock()
        runner.backward_input((0, i), grads)
        sync()
        t1 = clock()
        runner.backward_weight((0, i))
        sync()
        return t1 - t0, clock() - t1

    fulls, bs, ws = [], [], []
    for i in range(reps + 3):
        f = full()
        b, w = split(i)
        module.zero_grad(set_to_none=True)
        if i >= 3:
            fulls.append(f)
            bs.append(b)
            ws.append(w)
    med = statistics.median
    return {"stage": stage, "full_ms": round(med(fulls) * 1e3, 3), "B_ms": round(med(bs) * 1e3, 3),
            "W_ms": round(med(ws) * 1e3, 3),
            "ratio_B_plus_W_to_full": round((med(bs) + med(ws)) / med(fulls), 3)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--app", default="examples.gpt:app")
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--glibc-default-malloc", action="store_true",
                    help="do not keep freed host memory (what workers do on CPU)")
    args = ap.parse_args()
    kept = False if args.glibc_default_malloc or args.device != "cpu" else keep_freed_host_memory()
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    app = load_app(args.app)
    inputs, target = stage_inputs(app, args.stages, device)
    rows = [measure(app, s, args.stages, inputs[s], target, args.reps, device) for s in range(args.stages)]
    print(json.dumps({"app": args.app, "stages": args.stages, "device": args.device,
                      "threads": args.threads,
                      "clock": "process CPU time" if device.type == "cpu" else "wall",
                      "freed_host_memory_kept": kept, "torch": torch.__version__,
                      "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
