"""Outputs of `recycle bench`: markdown tables, the same tables as JSON, and PNG plots.

matplotlib (Agg backend) is imported inside the plotting functions so the planner stays fast to
import and a run without plots never loads it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from evaluation.strategies import STRATEGY_TITLES
from evaluation.trace import PlanLookups, StrategyDay

_COLOURS = {"adaptive": "#c44e52", "drop": "#4c72b0", "oobleck": "#55a868", "bamboo": "#8172b3",
            "checkpoint": "#937860"}


def markdown_table(header: list[str], rows: list[list[Any]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join("-" if v is None else str(v) for v in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def sweep_markdown(rows: list[dict], strategies: list[str]) -> str:
    """Throughput (micro-batches/s) per strategy, and adaptive's ratio over each alternative."""
    others = [s for s in strategies if s != "adaptive"]
    header = ["job", "pattern", "failed", "fraction"] + [f"{s} mb/s" for s in strategies]
    if "adaptive" in strategies:
        header += [f"adaptive / {s}" for s in others]
    body = []
    for r in rows:
        line = [f"{r['job']} ({r['shape']})", r["pattern"], r["failed"], f"{100 * r['fraction']:.2f}%"]
        line += [r["strategies"][s]["throughput_mb_s"] for s in strategies]
        if "adaptive" in strategies:
            line += [_ratio(r["adaptive_over"][s]) for s in others]
        body.append(line)
    return markdown_table(header, body)


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def text_table(header: list[str], rows: list[list[Any]]) -> str:
    """A fixed-width table for the terminal, numbers right-aligned."""
    cells = [header] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = []
    for row in cells:
        lines.append("  ".join(v.ljust(w) if i == 0 else v.rjust(w)
                               for i, (v, w) in enumerate(zip(row, widths, strict=True))))
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines) + "\n"


def headline_text(rows: list[dict], strategies: list[str]) -> str:
    """The terminal's headline: each job under its first failure pattern (spread by default),
    every strategy's throughput and adaptive's ratio over each alternative."""
    others = [s for s in strategies if s != "adaptive"]
    firsts = {}
    for r in rows:
        firsts.setdefault(r["job"], r["pattern"])
    header = ["job", "pattern", "failed"] + list(strategies)
    if "adaptive" in strategies:
        header += [f"vs {s}" for s in others]
    body = []
    for r in rows:
        if r["pattern"] != firsts[r["job"]]:
            continue
        line = [f"{r['job']} ({r['shape']})", r["pattern"], r["failed"]]
        line += [f"{r['strategies'][s]['throughput_mb_s']:.3f}" for s in strategies]
        if "adaptive" in strategies:
            line += [_ratio(r["adaptive_over"][s]) for s in others]
        body.append(line)
    note = "; vs X = adaptive's throughput / X's" if "adaptive" in strategies and others else ""
    return (f"Throughput (micro-batches/s of the full global batch{note}):\n"
            + text_table(header, body))


def day_text(days: dict[str, StrategyDay], duration_s: float, fault_free_rate: float) -> str:
    """The day's useful throughput per strategy, relative to the fault-free plan, for the terminal."""
    body = []
    for name, day in days.items():
        total = day.useful_microbatches()
        body.append([name, f"{total / (fault_free_rate * duration_s):.4f}", day.restarts,
                     f"{day.lost_s:.0f}", f"{day.time_in_plan_s.get('paused', 0.0):.0f}"])
    return text_table(["strategy", "vs fault-free", "restarts", "lost work (s)", "paused (s)"], body)


def day_markdown(days: dict[str, StrategyDay], duration_s: float, fault_free_rate: float) -> str:
    header = ["strategy", "useful micro-batches", "mean mb/s", "vs fault-free", "restarts", "lost work (s)",
              "paused (s)"]
    body = []
    for name, day in days.items():
        total = day.useful_microbatches()
        body.append([STRATEGY_TITLES[name], f"{total:.0f}", f"{total / duration_s:.3f}",
                     f"{total / (fault_free_rate * duration_s):.4f}", day.restarts, f"{day.lost_s:.0f}",
                     f"{day.time_in_plan_s.get('paused', 0.0):.0f}"])
    return markdown_table(header, body)


def plan_time_markdown(days: dict[str, StrategyDay], limit: int = 8) -> str:
    """Time spent in each plan (failure state) per strategy, longest first."""
    body = []
    for name, day in days.items():
        ranked = sorted(day.time_in_plan_s.items(), key=lambda kv: -kv[1])
        for label, seconds in ranked[:limit]:
            body.append([name, label, f"{seconds:.0f}"])
        if len(ranked) > limit:
            body.append([name, f"({len(ranked) - limit} more plans)",
                         f"{sum(s for _, s in ranked[limit:]):.0f}"])
    return markdown_table(["strategy", "plan", "seconds"], body)


def lookups_markdown(lookups: PlanLookups) -> str:
    j = lookups.as_json()
    return markdown_table(["precomputed", "solved live", "reused after a live solve", "live wait (s)"],
                          [[j["precomputed"], j["solved_live"], j["reused"], f"{j['live_wait_s']:.1f}"]])


def write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n", encoding="utf-8")


def compact_png(data: bytes, colours: int = 64) -> bytes:
    """The same image as a palette PNG of at most `colours` colours: plots use a handful, and the
    committed figures of docs/evaluation.md stay small (Pillow comes with matplotlib)."""
    import io

    from PIL import Image

    image = Image.open(io.BytesIO(data)).convert("RGB")
    out = io.BytesIO()
    image.quantize(colors=colours, method=Image.Quantize.MEDIANCUT).save(out, format="PNG", optimize=True)
    return out.getvalue()


def _save(fig, path: Path) -> None:
    import io

    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    path.write_bytes(compact_png(buf.getvalue()))


def _figure(width: float, height: float):
    import matplotlib

    matplotlib.use("Agg", force=False)
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), dpi=100)


def plot_sweep(rows: list[dict], strategies: list[str], path: Path) -> None:
    """Throughput vs failed fraction, one panel per (job, pattern), one line per strategy."""
    panels = list(dict.fromkeys((r["job"], r["pattern"]) for r in rows))
    cols = min(3, len(panels))
    n_rows = -(-len(panels) // cols)
    fig = _figure(4.2 * cols, 3.2 * n_rows + 0.6)
    for i, (job, pattern) in enumerate(panels):
        ax = fig.add_subplot(n_rows, cols, i + 1)
        mine = [r for r in rows if r["job"] == job and r["pattern"] == pattern]
        xs = [100 * r["fraction"] for r in mine]
        for s in strategies:
            ax.plot(xs, [r["strategies"][s]["throughput_mb_s"] for r in mine], marker="o", markersize=3,
                    color=_COLOURS[s], label=STRATEGY_TITLES[s])
        ax.set_title(f"{job}, {pattern}", fontsize=9)
        ax.set_xlabel("failed workers (%)", fontsize=8)
        ax.set_ylabel("micro-batches / s", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.set_ylim(bottom=0)
    handles, labels = fig.axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", ncol=min(5, len(labels)), fontsize=8, frameon=False)
    fig.subplots_adjust(bottom=0.5 / (3.2 * n_rows + 0.6) + 0.08, hspace=0.5, wspace=0.3)
    _save(fig, path)


def plot_day(days: dict[str, StrategyDay], duration_s: float, bin_s: float, path: Path,
             fault_free_rate: float) -> None:
    """Useful throughput over the trace, one line per strategy."""
    fig = _figure(9, 4)
    ax = fig.add_subplot()
    for name, day in days.items():
        values = day.binned(duration_s, bin_s)
        xs = [i * bin_s / 3600 for i in range(len(values))]
        ax.step(xs, values, where="post", color=_COLOURS[name], label=STRATEGY_TITLES[name], linewidth=1.2)
    ax.axhline(fault_free_rate, color="#333333", linestyle=":", linewidth=0.8, label="fault-free")
    ax.set_xlabel("time (h)")
    ax.set_ylabel(f"useful micro-batches / s ({bin_s / 60:g}-min bins)")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=7, loc="lower left")
    fig.tight_layout()
    _save(fig, path)


def write_gantt(result, path: Path) -> None:
    """The Gantt chart of one adapted plan, re-routed micro-batches hatched (planner.export)."""
    from planner.export.gantt import gantt_png

    path.write_bytes(compact_png(gantt_png(result.timeline_json())))
