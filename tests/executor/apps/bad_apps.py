"""Broken training apps, one defect each, for the start-up validation tests."""

from types import SimpleNamespace

import torch
from torch import nn

from tests.executor.apps import skipnet


def _good(**changes):
    base = vars(skipnet.app()).copy()
    base.update(changes)
    return SimpleNamespace(**{k: v for k, v in base.items() if v is not None})


def missing_loss():
    app = skipnet.app()
    del app.loss
    return app


def zero_microbatch():
    return _good(microbatch_size=0)


def stage_not_module():
    return _good(build_stage=lambda stage, stages: "not a module")


def mismatched_stages():
    def build(stage, stages):
        torch.manual_seed(stage)
        return nn.Linear(6, 5) if stage == 0 else nn.Linear(7, 3)
    return _good(build_stage=build)


class _Singles(torch.utils.data.Dataset):
    def __len__(self):
        return 4

    def __getitem__(self, i):
        return torch.zeros(6)


def items_not_pairs():
    return _good(dataset=_Singles())


def vector_loss():
    return _good(loss=lambda out, target: nn.functional.cross_entropy(out, target, reduction="none"))


def unseeded():
    return _good(build_stage=lambda stage, stages: skipnet.First() if stage == 0 else skipnet.Last())


def raising():
    raise RuntimeError("cannot open the data bucket")


not_callable = 42
