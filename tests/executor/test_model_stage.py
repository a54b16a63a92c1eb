"""Model, data and the B/W split, in one process."""

from __future__ import annotations

import pytest
import torch

from executor.data import DataConfig, MicrobatchSource
from executor.model import ConfigError, ModelConfig, build_stages
from executor.stage import StageError, StageRunner

TINY = ModelConfig(layers=6, width=32, heads=2, vocab=64, seq_len=16, seed=3)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"heads": 3}, "heads"), ({"width": 0}, "width"), ({"vocab": 1}, "vocab"), ({"layers": 2.5}, "layers"),
     ({"seed": -1}, "seed")],
)
def test_bad_model_config_names_the_field(kwargs, field):
    with pytest.raises(ConfigError) as err:
        ModelConfig(**kwargs)
    assert err.value.field == field
    assert field in str(err.value)


def test_more_stages_than_layers_is_refused():
    with pytest.raises(ConfigError, match="layers"):
        ModelConfig(layers=2).stage_layers(3)
    assert [len(r) for r in ModelConfig(layers=7).stage_layers(3)] == [3, 2, 2]


def test_microbatch_tokens_depend_only_on_their_coordinates():
    src = MicrobatchSource(TINY, DataConfig(batch_size=3))
    x1, y1 = src.load(4, 1, 2)
    x2, y2 = MicrobatchSource(TINY, DataConfig(batch_size=3)).load(4, 1, 2)
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == (3, TINY.seq_len) and int(x1.max()) < TINY.vocab
    assert torch.equal(x1[:, 1:], y1[:, :-1])
    assert not torch.equal(src.load(4, 2, 1)[0], x1)


def test_text_file_source(tmp_path):
    path = tmp_path / "corpus.txt"
    path.write_text("the quick brown fox jumps over the lazy dog " * 4)
    src = MicrobatchSource(TINY, DataConfig(text_file=str(path)))
    x, y = src.load(0, 0, 0)
    assert torch.equal(x[:, 1:], y[:, :-1])
    with pytest.raises(ConfigError, match="text_file"):
        DataConfig(text_file=str(tmp_path / "missing.txt"))


def test_replicas_of_a_stage_start_identical_and_stages_differ():
    a, b = build_stages(TINY, 3), build_stages(TINY, 3)
    for s in range(3):
        assert torch.equal(a[s].flat_parameters(), b[s].flat_parameters())
    assert not torch.equal(a[1].blocks[0].qkv_w, a[2].blocks[0].qkv_w)


def test_split_backward_gives_the_full_backward_gradients():
    stages, mbs = 3, [(0, 0), (1, 0), (0, 1)]
    src = MicrobatchSource(TINY, DataConfig())
    ref, split = build_stages(TINY, stages), build_stages(TINY, stages)
    for mb in mbs:
        x, y = src.load(0, *mb)
        for s in range(stages - 1):
            x = ref[s](x)
        (ref[-1](x, y) / len(mbs)).backward()
    runners = [StageRunner(m, 1 / len(mbs)) for m in split]
    for mb in mbs:
        x, y = src.load(0, *mb)
        for r in runners:
            x = r.forward(mb, x, y if r.last else None)
    for mb in reversed(mbs):
        g = None
        for r in reversed(runners):
            g = r.backward_input(mb, g)
            assert all(p.grad is None for p in r.module.parameters()), "B must not touch weight grads"
    for mb in mbs:
        for r in runners:
            r.backward_weight(mb)
    for s in range(stages):
        for (name, p), q in zip(ref[s].named_parameters(), split[s].parameters(), strict=True):
            rel = float((p.grad - q.grad).norm() / p.grad.norm())
            assert rel < 1e-5, f"stage {s} {name}: {rel}"


def test_ops_out_of_order_are_errors():
    runner = StageRunner(build_stages(TINY, 2)[1], 1.0)
    x = torch.zeros(2, TINY.seq_len, TINY.width)
    with pytest.raises(StageError, match="without a pending F"):
        runner.backward_input((0, 0))
    runner.forward((0, 0), x, torch.zeros(2, TINY.seq_len, dtype=torch.int64))
    with pytest.raises(StageError, match="twice"):
        runner.forward((0, 0), x, torch.zeros(2, TINY.seq_len, dtype=torch.int64))
    with pytest.raises(StageError, match="without a finished B"):
        runner.backward_weight((0, 0))
    with pytest.raises(StageError, match="in flight"):
        runner.start_iteration()
