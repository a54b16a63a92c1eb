"""The dependency rules of docs/design.md, enforced: every import in every package's source files
(read with `ast`, so a forbidden import fails here even if no test executes that line), plus the
planner starting without torch or the web stack loaded."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
WEB = {"fastapi", "starlette", "uvicorn", "sqlalchemy", "httptools", "uvloop", "psycopg"}
FORBIDDEN = {
    "planner": {"api", "executor", "cli", "torch", "evaluation"} | WEB,
    # cli/ holds every command's parsing and output and calls into the packages, never the reverse
    "api": {"torch", "executor", "evaluation", "cli"},
    "executor": {"api", "evaluation", "cli"} | WEB - {"httpx"},
    # evaluation/ consumes the planner and nothing else of the project (docs/design.md).
    "evaluation": {"api", "executor", "cli", "torch"} | WEB,
}


def imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    roots = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            roots |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def violations(package: str, forbidden: set[str]) -> list[str]:
    found = []
    for path in sorted((REPO / package).rglob("*.py")):
        bad = imported_roots(path) & forbidden
        if bad:
            found.append(f"{path.relative_to(REPO)} imports {sorted(bad)}")
    return found


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_package_imports_only_what_the_layout_allows(package):
    assert violations(package, FORBIDDEN[package]) == []


@pytest.mark.parametrize(("package", "source", "root"), [
    ("planner", "def f():\n    import torch.nn as nn\n    return nn\n", "torch"),
    ("planner", "from evaluation.strategies import Evaluator\n", "evaluation"),
    ("evaluation", "from api.db import Store\n", "api"),
    ("evaluation", "import executor.worker\n", "executor"),
    ("executor", "from cli.worker import place\n", "cli"),
    ("api", "import cli.serve\n", "cli"),
])
def test_the_checker_sees_a_forbidden_import(tmp_path, monkeypatch, package, source, root):
    (tmp_path / package / "sub").mkdir(parents=True)
    (tmp_path / package / "sub" / "leak.py").write_text(source)
    monkeypatch.setattr(sys.modules[__name__], "REPO", tmp_path)
    assert violations(package, FORBIDDEN[package]) == [f"{package}/sub/leak.py imports ['{root}']"]


def test_command_code_lives_in_cli_only():
    """Argument parsing belongs to cli/: no package keeps a command module of its own."""
    strays = [str(p.relative_to(REPO)) for package in FORBIDDEN for p in (REPO / package).rglob("*.py")
              if p.stem == "cli" or p.stem.endswith(("_cli", "_cmd"))
              or "argparse" in imported_roots(p)]
    assert strays == []


def test_evaluation_is_a_top_level_package_outside_the_planner():
    assert (REPO / "evaluation" / "__init__.py").is_file()
    assert not (REPO / "planner" / "evaluation").exists()


def test_planning_loads_neither_torch_nor_the_web_stack():
    code = ("import sys, planner.solve, planner.validate, planner.simulator, planner.instructions;"
            "heavy = sorted(m for m in ('torch', 'fastapi', 'uvicorn', 'sqlalchemy') if m in sys.modules);"
            "print(heavy)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
