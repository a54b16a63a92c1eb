"""`skipnet`'s app, except that one stage-1 worker process raises in a forward (a bug in the user's
model, not a signal): with CRASHING_MARKER set, the first stage-1 process to reach its
CRASHING_AFTER-th forward creates that file and raises; every other process, and any run without
the variable, trains exactly like `skipnet`."""

from __future__ import annotations

import os
from types import SimpleNamespace

from tests.executor.apps import skipnet

_forwards = 0


class CrashingMiddle(skipnet.Middle):
    def forward(self, h, skip):
        global _forwards
        _forwards += 1
        marker = os.environ.get("CRASHING_MARKER")
        if marker and _forwards == int(os.environ.get("CRASHING_AFTER", "7")):
            try:
                os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
            except FileExistsError:
                pass  # another process crashed already: this one trains on
            else:
                raise RuntimeError(f"crashing app: a bug in the model at forward {_forwards}")
        return super().forward(h, skip)


def build_stage(stage: int, stages: int):
    module = skipnet.build_stage(stage, stages)
    if isinstance(module, skipnet.Middle):
        crashing = CrashingMiddle()
        crashing.load_state_dict(module.state_dict())
        return crashing
    return module


def app():
    return SimpleNamespace(**{**vars(skipnet.app()), "build_stage": build_stage})
