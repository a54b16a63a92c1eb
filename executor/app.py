"""The training app a user hands the executor (`--app MODULE:ATTR`, ../shared/docs/contracts.md).

`load_app` imports MODULE, calls the zero-argument factory ATTR and checks the object it returns;
`validate_app` then runs micro-batch 0 through every stage in one process, so a stage whose output
does not fit the next stage's input, a dataset item that is not `(input, target)` or a loss that is
not a scalar is reported (one line naming the attribute or stage) before any worker is started.

Every error is an `AppError` whose message is one line: launchers print it and exit with code 2.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import default_collate

REQUIRED = ("build_stage", "dataset", "microbatch_size", "loss", "optimizer")


class AppError(ValueError):
    """The training app is unusable; the message names the attribute or stage and says why."""


@dataclass(frozen=True)
class TrainingApp:
    spec: str
    """`MODULE:ATTR` as given (workers import the same string)."""
    build_stage: Callable[[int, int], torch.nn.Module]
    dataset: Any
    microbatch_size: int
    loss: Callable[[Any, Any], torch.Tensor]
    optimizer: Callable[[Any], torch.optim.Optimizer]

    def item_indices(self, iteration: int, j: int, n: int) -> list[int]:
        """Dataset items of micro-batch j (= home x M + index) of `iteration`, n = D x M (contract)."""
        size, length = self.microbatch_size, len(self.dataset)
        return [((iteration * n + j) * size + k) % length for k in range(size)]

    def microbatch(self, iteration: int, j: int, n: int) -> tuple[Any, Any]:
        """`default_collate` of the micro-batch's items, split into (input, target)."""
        items = [self.dataset[i] for i in self.item_indices(iteration, j, n)]
        for i, item in zip(self.item_indices(iteration, j, n), items, strict=True):
            if not (isinstance(item, tuple | list) and len(item) == 2):
                raise AppError(f"app {self.spec}: dataset[{i}] must be an (input, target) pair, got "
                               f"{_describe(item)}")
        batch = default_collate(items)
        return batch[0], batch[1]


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, tuple | list):
        return f"a {type(value).__name__} of {len(value)}"
    return type(value).__name__


def load_app(spec: str) -> TrainingApp:
    """Import `MODULE:ATTR`, call the factory and check every attribute's presence and type."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise AppError(f"app {spec!r}: expected MODULE:ATTR (e.g. examples.gpt:app)")
    if "" not in sys.path and str(Path.cwd()) not in sys.path:
        sys.path.insert(0, str(Path.cwd()))  # like `python -m`: the app may live in the current folder
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        raise AppError(f"app {spec}: cannot import module {module_name!r} ({exc})") from None
    except Exception as exc:
        raise AppError(f"app {spec}: importing {module_name!r} raised {type(exc).__name__}: "
                       f"{_one_line(exc)}") from None
    factory = getattr(module, attr, None)
    if factory is None:
        raise AppError(f"app {spec}: module {module_name!r} has no attribute {attr!r}")
    if not callable(factory):
        raise AppError(f"app {spec}: {attr!r} must be a zero-argument factory, got {type(factory).__name__}")
    obj = _user_call(spec, f"the factory {attr}()", factory)
    missing = [name for name in REQUIRED if not hasattr(obj, name)]
    if missing:
        raise AppError(f"app {spec}: attribute {missing[0]!r} is missing "
                       f"(the app needs {', '.join(REQUIRED)})")
    for name in ("build_stage", "loss", "optimizer"):
        if not callable(getattr(obj, name)):
            raise AppError(f"app {spec}: attribute {name!r} must be callable")
    size = obj.microbatch_size
    if isinstance(size, bool) or not isinstance(size, int) or size < 1:
        raise AppError(f"app {spec}: attribute 'microbatch_size' must be a positive int, got {size!r}")
    dataset = obj.dataset
    if not (hasattr(dataset, "__getitem__") and hasattr(dataset, "__len__")):
        raise AppError(f"app {spec}: attribute 'dataset' must be a map-style Dataset (__getitem__ and "
                       f"__len__), got {type(dataset).__name__}")
    length = _user_call(spec, "len(dataset)", len, dataset)
    if length < 1:
        raise AppError(f"app {spec}: attribute 'dataset' is empty")
    return TrainingApp(spec, obj.build_stage, dataset, size, obj.loss, obj.optimizer)


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split())
    return text[:300] + ("..." if len(text) > 300 else "")


def _user_call(spec: str, what: str, fn, *args) -> Any:
    """`fn(*args)`, a call into the user's code: whatever it raises becomes one AppError line
    naming the call (`what`), never a traceback."""
    try:
        return fn(*args)
    except Exception as exc:
        raise AppError(f"app {spec}: {what} raised {type(exc).__name__}: {_one_line(exc)}") from None


def build_stage(app: TrainingApp, stage: int, stages: int) -> torch.nn.Module:
    """`app.build_stage`, checked: an nn.Module (errors name the stage)."""
    module = _user_call(app.spec, f"build_stage({stage}, {stages})", app.build_stage, stage, stages)
    if not isinstance(module, torch.nn.Module):
        raise AppError(f"app {app.spec}: build_stage({stage}, {stages}) must return a torch.nn.Module, "
                       f"got {type(module).__name__}")
    return module


def as_tuple(value: Any) -> tuple:
    return tuple(value) if isinstance(value, tuple | list) else (value,)


def call_stage(module: torch.nn.Module, inputs: tuple) -> Any:
    """Stage s > 0 receives stage s-1's output. A tuple of k > 1 tensors is unpacked into positional
    arguments when the stage's forward takes k of them (`forward(self, x, skip)`), and passed whole
    when it takes one (`forward(self, inputs)`): both styles are written in practice."""
    if len(inputs) > 1 and _positional_arity(module) == 1:
        return module(inputs)
    return module(*inputs)


def _positional_arity(module: torch.nn.Module) -> int | None:
    """Positional parameters of `module.forward` (None when it takes *args)."""
    try:
        params = inspect.signature(module.forward).parameters.values()
    except (TypeError, ValueError):
        return None
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return None
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params)


def validate_app(app: TrainingApp, stages: int) -> list[list[tuple[tuple[int, ...], torch.dtype]]]:
    """Build every stage, check identical initial parameters across two builds, and run micro-batch 0
    through the chain; returns each stage's output signature ([(shape, dtype), ...] per stage)."""
    if stages < 1:
        raise AppError(f"stages: must be >= 1, got {stages}")
    modules = [build_stage(app, s, stages) for s in range(stages)]
    for s in range(stages):
        again = build_stage(app, s, stages)
        a, b = modules[s].state_dict(), again.state_dict()
        if a.keys() != b.keys() or any(not torch.equal(a[k], b[k]) for k in a):
            raise AppError(f"app {app.spec}: build_stage({s}, {stages}) gives different parameters on two "
                           f"calls; seed it so every process starts from the same parameters")
    x, target = app.microbatch(0, 0, 1)
    signatures = []
    value: Any = x
    for s, module in enumerate(modules):
        try:
            value = module(value) if s == 0 else call_stage(module, as_tuple(value))
        except Exception as exc:
            what = "the dataset's input" if s == 0 else f"stage {s - 1}'s output"
            raise AppError(f"app {app.spec}: stage {s} cannot take {what}: {type(exc).__name__}: "
                           f"{_one_line(exc)}") from None
        parts = as_tuple(value)
        if not parts or not all(isinstance(t, torch.Tensor) for t in parts):
            raise AppError(f"app {app.spec}: stage {s} must return a tensor or a tuple of tensors, got "
                           f"{_describe(value)}")
        signatures.append([(tuple(t.shape), t.dtype) for t in parts])
    loss = _user_call(app.spec, "loss(output, target)", app.loss, value, target)
    if not isinstance(loss, torch.Tensor) or loss.numel() != 1 or loss.dim() != 0:
        raise AppError(f"app {app.spec}: loss(output, target) must return a scalar tensor, got "
                       f"{_describe(loss)}")
    if not loss.requires_grad:
        raise AppError(f"app {app.spec}: loss(output, target) does not depend on any parameter")
    for s, module in enumerate(modules):
        opt = _user_call(app.spec, "optimizer(params)", app.optimizer, module.parameters())
        if not isinstance(opt, torch.optim.Optimizer):
            raise AppError(f"app {app.spec}: optimizer(params) must return a torch.optim.Optimizer, got "
                           f"{type(opt).__name__} (stage {s})")
    return signatures
