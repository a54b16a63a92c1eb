"""Every benchmark script starts: `--help` exits 0.

The figures in docs/benchmarks.md are only reproducible while their commands run; two scripts
(planner_quality.py, cp_optimality.py) stopped starting when `validate` moved out of
planner/simulator.py, and nothing noticed until someone re-ran them. This catches that class of
breakage (a moved import, a renamed flag default evaluated at parse time) without running any
benchmark.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SCRIPTS = sorted(p.name for p in (REPO / "benchmarks").glob("*.py") if not p.name.startswith("_"))
HELPERS = {"api_common.py", "executor_common.py", "abuse_traffic.py", "abuse_random.py", "abuse_verify.py",
           "falsify_common.py"}
"""Modules the benchmarks import, not commands: they must import cleanly instead."""


def test_the_script_list_is_not_empty():
    assert "planner_quality.py" in SCRIPTS and "cp_optimality.py" in SCRIPTS


@pytest.mark.parametrize("script", [s for s in SCRIPTS if s not in HELPERS])
def test_benchmark_script_answers_help(script):
    result = subprocess.run([sys.executable, f"benchmarks/{script}", "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "usage" in result.stdout.lower(), result.stdout[:500]


@pytest.mark.parametrize("module", sorted(s[:-3] for s in HELPERS))
def test_benchmark_helper_module_imports(module):
    result = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=REPO / "benchmarks",
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
