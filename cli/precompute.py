"""`recycle precompute`: plan every canonical failure class of a job into a directory.

Resumable: one timeline JSON per class plus `index.json`, written atomically; classes already in the
index (or whose file a previous run wrote after its last index checkpoint) are not planned again.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from cli.plan import EXIT_INVALID, EXIT_OK, CliError, check_time_limit, load_job, load_json
from cli.timeline_text import timeline_text

INDEX_FORMAT = "recycle.precompute/v1"
INDEX_CHECKPOINT_S = 2.0


def class_file_name(key: str) -> str:
    """`0:3;1:2` -> `fail_0-3_1-2.json`; `none` -> `fail_none.json`."""
    return "fail_" + key.replace(":", "-").replace(";", "_") + ".json"


def cmd_precompute(args: argparse.Namespace) -> int:
    job = load_job(args.job)
    time_limit = check_time_limit(args.time_limit)
    if args.max_failures < 0:
        raise CliError(f"--max-failures: must be >= 0, got {args.max_failures}")
    out_dir = Path(args.output)
    if out_dir.exists() and not out_dir.is_dir():
        raise CliError(f"-o {out_dir}: exists and is not a directory")
    index_path = out_dir / "index.json"
    index = _load_index(index_path, job)
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CliError(f"-o {out_dir}: cannot create ({exc.strerror or exc})") from None

    from tqdm import tqdm

    from planner.failures import enumerate_failure_classes, normalize, raw_failure_set_count
    from planner.solve import plan
    from planner.validate import PlanInvalid

    classes = list(enumerate_failure_classes(job, args.max_failures))
    raw = raw_failure_set_count(job, args.max_failures)
    print(f"{len(classes)} canonical failure classes for 0..{args.max_failures} failures "
          f"(of {raw} raw failure sets; {raw / max(1, len(classes)):.1f}x fewer plans)", file=sys.stderr)
    index["max_failures"] = max(args.max_failures, index.get("max_failures", 0))
    todo = []
    for failed in classes:
        key = normalize(job, failed).key
        entry = index["classes"].get(key)
        if entry is not None and (out_dir / entry["file"]).is_file():
            continue
        # A class file written after the last index checkpoint is recovered, not planned again.
        recovered = _entry_from_file(out_dir / class_file_name(key), failed)
        if recovered is not None:
            index["classes"][key] = recovered
        else:
            todo.append((key, failed))
    print(f"{len(classes) - len(todo)} already planned in {out_dir}, {len(todo)} to plan", file=sys.stderr)
    checkpoint = time.monotonic()
    try:
        for key, failed in tqdm(todo, desc="planning", unit="class", file=sys.stderr, disable=None):
            try:
                result = plan(job, failed, time_limit_s=time_limit, use_cp=not args.no_cp)
            except (PlanInvalid, RuntimeError, ValueError) as exc:  # report, go on with the others
                index["unplannable"][key] = f"{type(exc).__name__}: {exc}"
                continue
            name = class_file_name(key)
            _write_atomic(out_dir / name, timeline_text(result))
            index["unplannable"].pop(key, None)
            index["classes"][key] = _index_entry(name, failed, result.summary_json())
            if time.monotonic() - checkpoint > INDEX_CHECKPOINT_S:  # not per class: O(n^2) writes
                _write_atomic(index_path, json.dumps(index, indent=1))
                checkpoint = time.monotonic()
    finally:  # also on Ctrl-C, so the next run skips what is done
        _write_atomic(index_path, json.dumps(index, indent=1))
    print(f"wrote {len(index['classes'])} plans and {index_path}", file=sys.stderr)
    if index["unplannable"]:
        print(f"{len(index['unplannable'])} class(es) could not be planned:", file=sys.stderr)
        for key, reason in sorted(index["unplannable"].items()):
            print(f"  {key}: {reason}", file=sys.stderr)
        return EXIT_INVALID
    return EXIT_OK


def _index_entry(name: str, failed, summary: dict[str, Any]) -> dict[str, Any]:
    """One class of index.json, from `PlanResult.summary_json()` (a timeline's `solver` field)."""
    return {
        "file": name,
        "failed": [list(w) for w in failed],
        "iteration_ms": summary["iteration_ms"],
        "bound_ms": summary["lower_bound_ms"],
        "gap": summary["gap"],
        "status": summary["status"],
    }


def _entry_from_file(path: Path, failed) -> dict[str, Any] | None:
    """The index entry of a class file a previous run wrote, or None if it is absent or unreadable."""
    try:
        timeline = json.loads(path.read_text(encoding="utf-8"))
        if sorted(map(tuple, timeline["failed"])) != sorted(failed):
            return None
        return _index_entry(path.name, failed, timeline["solver"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _load_index(path: Path, job) -> dict[str, Any]:
    fresh = {"format": INDEX_FORMAT, "job": job.filled(), "max_failures": 0, "classes": {},
             "unplannable": {}}
    if not path.exists():
        return fresh
    index = load_json(str(path), "index")
    if not isinstance(index, dict) or index.get("format") != INDEX_FORMAT \
            or not isinstance(index.get("classes"), dict):
        raise CliError(f"{path}: not a {INDEX_FORMAT} index; choose an empty directory")
    if index.get("job") != job.filled():
        raise CliError(f"{path}: holds plans of a different job spec; choose another directory")
    index.setdefault("unplannable", {})
    return index


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as exc:
        raise CliError(f"{path}: cannot write ({exc.strerror or exc})") from None
