"""The built-in model, its data and the workers' B/W split on it, in one process."""

from __future__ import annotations

import pytest
import torch

from executor.app_stage import AppStageRunner
from executor.data import DataConfig, Samples, builtin_app
from executor.iteration_book import StageError
from executor.model import ConfigError, ModelConfig, build_stages, loss

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


def test_samples_depend_only_on_their_index():
    data = Samples(TINY, DataConfig())
    x1, y1 = data[1234]
    x2, y2 = Samples(TINY, DataConfig())[1234]
    assert torch.equal(x1, x2) and torch.equal(y1, y2)
    assert x1.shape == (TINY.seq_len,) and int(x1.max()) < TINY.vocab and x1.dtype == torch.int64
    assert torch.equal(x1[1:], y1[:-1])
    stride = int((x1[1] - x1[0]) % TINY.vocab)  # synthetic: an arithmetic sequence modulo vocab
    assert 1 <= stride <= 4
    assert torch.equal(x1, (x1[0] + stride * torch.arange(TINY.seq_len)) % TINY.vocab)
    assert not torch.equal(data[1235][0], x1)


def test_builtin_app_addresses_items_as_the_contract_says():
    app = builtin_app(TINY, DataConfig(batch_size=3))
    # iteration 2, micro-batch j = 5 of n = 8: items ((2 * 8 + 5) * 3 + k) = 63, 64, 65
    x, y = app.microbatch(2, 5, 8)
    data = Samples(TINY, DataConfig(batch_size=3))
    assert torch.equal(x, torch.stack([data[i][0] for i in (63, 64, 65)]))
    assert torch.equal(y, torch.stack([data[i][1] for i in (63, 64, 65)]))


def test_text_file_samples(tmp_path):
    path = tmp_path / "corpus.txt"
    text = "the quick brown fox jumps over the lazy dog " * 4
    path.write_text(text)
    x, y = Samples(TINY, DataConfig(text_file=str(path)))[7]
    assert torch.equal(x[1:], y[:-1])
    window = bytes(int(v) for v in x)  # vocab 64: the bytes modulo 64
    assert window in bytes(b % 64 for b in text.encode())
    with pytest.raises(ConfigError, match="text_file"):
        DataConfig(text_file=str(tmp_path / "missing.txt"))


def test_replicas_of_a_stage_start_identical_and_stages_differ():
    a, b = build_stages(TINY, 3), build_stages(TINY, 3)
    for s in range(3):
        assert torch.equal(a[s].flat_parameters(), b[s].flat_parameters())
    assert not torch.equal(a[1].blocks[0].qkv.weight, a[2].blocks[0].qkv.weight)


def test_split_backward_gives_the_full_backward_gradients():
    """The workers' runner on the built-in model (stock Linear/LayerNorm layers swapped on stages
    1-2, the generic split for the embeddings) against one ordinary backward of the whole model."""
    stages, mbs = 3, [(0, 0), (1, 0), (0, 1)]
    app = builtin_app(TINY)
    ref, split = build_stages(TINY, stages), build_stages(TINY, stages)
    for j, _ in enumerate(mbs):
        x, y = app.microbatch(0, j, len(mbs))
        for s in range(stages):
            x = ref[s](x)
        (loss(x, y) / len(mbs)).backward()
    runners = [AppStageRunner(m, app, s, stages, 1 / len(mbs)) for s, m in enumerate(split)]
    for j, mb in enumerate(mbs):
        x, y = app.microbatch(0, j, len(mbs))
        for r in runners:
            out = r.forward(mb, x, y if r.last else None)
            x = out
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
    runner = AppStageRunner(build_stages(TINY, 2)[1], builtin_app(TINY), 1, 2, 1.0)
    x = (torch.zeros(2, TINY.seq_len, TINY.width),)
    y = torch.zeros(2, TINY.seq_len, dtype=torch.int64)
    with pytest.raises(StageError, match="without a pending F"):
        runner.backward_input((0, 0), None)
    runner.forward((0, 0), x, y)
    with pytest.raises(StageError, match="twice"):
        runner.forward((0, 0), x, y)
    with pytest.raises(StageError, match="without a finished B"):
        runner.backward_weight((0, 0))
    with pytest.raises(StageError, match="in flight"):
        runner.start_iteration()
