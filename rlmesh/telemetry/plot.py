"""``rlmesh plot RUN [RUN ...]``: a run's curves as one PNG, for headless use (the dashboard's, on paper).

Why a PNG from the CLI: the first question after a run is "did it learn?", and the answer
should not need a browser or a notebook. The panels are the ``plot=True`` charts of
:mod:`rlmesh.telemetry.charts` — the same SQL and axes the dashboard draws — stacked on one
shared env-steps axis: the greedy evaluation (the metric a recipe stops on), the rollouts'
episodic return and the training losses. Lines break where the run stalled; a dashed red line
marks every proc death. Several runs (a sweep's members) are overlaid, one colour per run.
Works live (through the service) and after the run; matplotlib's Agg backend (no display).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rlmesh.telemetry import charts
from rlmesh.telemetry import run as run_paths
from rlmesh.telemetry.errors import TelemetryError
from rlmesh.telemetry.reader import query_run_dir


def _draw(ax: Any, data: charts.ChartData, color: Any, label_prefix: str, styles: list[str]) -> int:
    """Draw a chart's series on ``ax`` (None points leave gaps); returns how many were drawn."""
    drawn = 0
    for i, s in enumerate(data.series):
        if not s.x:
            continue
        xs = [float("nan") if v is None else v for v in s.x]
        ys = [float("nan") if v is None else v for v in s.y]
        style = styles[i % len(styles)]
        marker = "o" if data.kind == charts.ChartKind.MARKERS or len([v for v in xs if v == v]) < 3 else None
        ax.plot(xs, ys, style, color=color, lw=1.5, marker=marker, ms=3, label=f"{label_prefix}{s.name}")
        drawn += 1
    return drawn


def plot_run(run: str | os.PathLike[str] | None = None, out: str | os.PathLike[str] | None = None,
             runs: list[str | os.PathLike[str]] | None = None) -> Path:
    """Render the curves of ``run`` (or overlay every run in ``runs``) to ``out`` (default
    ``runs/<run>/curves.png``); returns the path."""
    try:
        import matplotlib  # deferred: optional extra rlmesh[plot], loaded only by rlmesh plot

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # deferred: optional extra rlmesh[plot], loaded only by rlmesh plot
    except ImportError as exc:
        raise ImportError("rlmesh plot needs matplotlib: pip install 'rlmesh[plot]'") from exc
    run_dirs = [run_paths.resolve_run(r) for r in (runs or [run])]  # type: ignore[list-item]  # run is set when runs is empty (the CLI checks)
    panels = charts.plot_panels()
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3 * len(panels)), sharex=True, squeeze=False)
    axes = axes[:, 0]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    overlay = len(run_dirs) > 1
    drawn = [0] * len(panels)
    deaths_total = 0
    for k, run_dir in enumerate(run_dirs):
        q = charts.memoized(lambda sql, _d=run_dir: query_run_dir(_d, sql))  # type: ignore[misc]  # a lambda with a default argument (binds the loop's value): mypy cannot infer it

        color = colors[k % len(colors)] if overlay else None
        prefix = f"{run_dir.name} " if overlay else ""
        deaths = charts.evaluate(charts.DEATHS, q)
        died_at = [x for s in deaths.series for x in s.x if x is not None]
        deaths_total += len(died_at)
        for i, (ax, spec) in enumerate(zip(axes, panels)):
            data = charts.evaluate(spec, q)
            styles = ["-", "--", ":", "-."]
            if overlay:
                drawn[i] += _draw(ax, data, color, prefix, styles)
            else:
                for j, s in enumerate(data.series):  # one colour per series within a single run
                    one = charts.ChartData(data.id, data.title, data.kind, data.x_label, data.y_label, [s])
                    drawn[i] += _draw(ax, one, colors[j % len(colors)], "", ["-"])
            for d in died_at:
                ax.axvline(d, color="tab:red", ls="--", lw=0.8, alpha=0.7)
    for ax, spec, n in zip(axes, panels, drawn):
        ax.set_title(spec.title)
        ax.set_ylabel(spec.y_label)
        ax.grid(alpha=0.3)
        if n:
            ax.legend(fontsize=7, loc="best")
        else:
            ax.text(0.5, 0.5, "no rows yet", ha="center", va="center", transform=ax.transAxes)
    axes[-1].set_xlabel("env steps (generated for rollouts, trained for evaluation and losses)")
    names = ", ".join(d.name for d in run_dirs)
    fig.suptitle(f"run{'s' if overlay else ''} {names}" + (f"  ({deaths_total} proc death"
                 f"{'' if deaths_total == 1 else 's'} dashed red)" if deaths_total else ""), fontsize=10)
    fig.tight_layout()
    path = Path(out) if out else run_dirs[0] / ("curves.png" if not overlay else "compare.png")
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_main(argv: list[str]) -> int:
    """``rlmesh plot [RUN ...] [--out FILE]``: prints the PNG's path."""
    p = argparse.ArgumentParser(prog="rlmesh plot",
                                description="evaluation, reward and loss curves of a run (or of several, overlaid), as PNG")
    p.add_argument("runs", nargs="*", default=None,
                   help="run id, 'latest' (default), run dir or .duckdb file; several runs are overlaid (a sweep)")
    p.add_argument("--out", help="PNG path (default runs/<run>/curves.png, or compare.png for several)")
    a = p.parse_args(argv)
    try:
        print(plot_run(None, a.out, runs=a.runs or None))
    except (TelemetryError, ImportError, FileNotFoundError) as exc:
        print(f"rlmesh plot: {exc}", file=sys.stderr)
        return 1
    return 0
