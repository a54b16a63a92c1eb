"""The training app contract at start-up: data addressing worked by hand, and every kind of broken
app refused by `recycle train --app` with one line naming the problem and exit code 2, before any
process starts."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from executor.app import load_app, validate_app

GOOD = "tests.executor.apps.skipnet:app"


def test_microbatch_items_follow_the_contract_formula():
    app = load_app(GOOD)  # 61 items, microbatch_size 3
    # n = D x M = 8; iteration 2, j = 1 x 4 + 3 = 7: ((2*8 + 7) * 3 + k) mod 61 = 69..71 mod 61 = 8..10
    assert app.item_indices(2, 7, 8) == [8, 9, 10]
    x, y = app.microbatch(2, 7, 8)
    assert torch.equal(x, torch.stack([app.dataset[i][0] for i in (8, 9, 10)]))
    assert torch.equal(y, torch.stack([app.dataset[i][1] for i in (8, 9, 10)]))


def test_examples_load_validate_and_pass_tuples_between_stages():
    gpt = validate_app(load_app("examples.gpt:app"), 2)
    assert gpt[0] == [((4, 32, 64), torch.float32)] and gpt[1] == [((4, 32, 256), torch.float32)]
    conv = validate_app(load_app("examples.conv:app"), 3)
    assert [len(sig) for sig in conv] == [2, 2, 1]


@pytest.mark.parametrize(("app", "message"), [
    ("tests.executor.apps.bad_apps:missing_loss", "attribute 'loss' is missing"),
    ("tests.executor.apps.bad_apps:zero_microbatch", "'microbatch_size' must be a positive int"),
    ("tests.executor.apps.bad_apps:stage_not_module", "must return a torch.nn.Module"),
    ("tests.executor.apps.bad_apps:mismatched_stages", "stage 1 cannot take stage 0's output"),
    ("tests.executor.apps.bad_apps:items_not_pairs", "must be an (input, target) pair"),
    ("tests.executor.apps.bad_apps:vector_loss", "must return a scalar tensor"),
    ("tests.executor.apps.bad_apps:unseeded", "different parameters on two calls"),
    ("tests.executor.apps.bad_apps:raising", "raised RuntimeError: cannot open the data bucket"),
    ("tests.executor.apps.bad_apps:not_callable", "must be a zero-argument factory"),
    ("tests.executor.apps.bad_apps:nothing", "has no attribute 'nothing'"),
    ("tests.executor.apps.nowhere:app", "cannot import module"),
    ("no_colon", "expected MODULE:ATTR"),
])
def test_bad_app_is_one_line_exit_2_before_any_process(app, message):
    proc = subprocess.run([sys.executable, "-m", "cli.main", "train", "--app", app, "--stages", "2",
                           "--pipelines", "2", "--iterations", "1"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert message in lines[0] and "Traceback" not in proc.stderr
