"""``rlmesh plot RUN``: reward and loss curves of a run as one PNG, with proc deaths marked.

Why a PNG from the CLI: the first question after a run is "did it learn?", and the
answer should not need a notebook. Reward is the mean ``rollouts.reward`` per time
bin, loss is ``train_steps.loss`` per step; a dashed red line marks every ``died``
event in ``actors`` so a dip can be matched with a crash at a glance. Works live
(through the service) and after the run. Uses matplotlib's Agg backend (no display).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

import numpy as np

from rlmesh.telemetry import run as runs
from rlmesh.telemetry.errors import TelemetryError
from rlmesh.telemetry.reader import query_run_dir

MAX_POINTS = 200


def _binned(t: np.ndarray, y: np.ndarray, bins: int = MAX_POINTS) -> tuple[np.ndarray, np.ndarray]:
    """Mean of ``y`` in up to ``bins`` equal-width bins of ``t`` (empty bins dropped)."""
    if len(t) <= bins:
        return t, y
    edges = np.linspace(t.min(), t.max(), bins + 1)
    idx = np.clip(np.digitize(t, edges) - 1, 0, bins - 1)
    counts = np.bincount(idx, minlength=bins)
    sums = np.bincount(idx, weights=y, minlength=bins)
    keep = counts > 0
    centers = (edges[:-1] + edges[1:]) / 2
    return centers[keep], sums[keep] / counts[keep]


def _s(n: int) -> str:
    return "" if n == 1 else "s"


def _col(tbl: Any, name: str) -> np.ndarray:
    return np.asarray(tbl.column(name).to_numpy(zero_copy_only=False), dtype=np.float64)


def plot_run(run: str | os.PathLike[str] | None = None, out: str | os.PathLike[str] | None = None) -> Path:
    """Render the run's curves to ``out`` (default ``runs/<run>/curves.png``); returns the path."""
    try:
        import matplotlib  # deferred: optional extra rlmesh[plot], loaded only by rlmesh plot

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt  # deferred: optional extra rlmesh[plot], loaded only by rlmesh plot
    except ImportError as exc:
        raise ImportError("rlmesh plot needs matplotlib: pip install 'rlmesh[plot]'") from exc
    run_dir = runs.resolve_run(run)

    def q(sql: str) -> Any:
        return query_run_dir(run_dir, sql)

    t0 = q("SELECT epoch(start_ts) AS t0 FROM runs LIMIT 1")
    start = t0.column("t0")[0].as_py() if t0.num_rows else 0.0
    rew = q("SELECT epoch(ts) AS t, reward FROM rollouts WHERE reward IS NOT NULL ORDER BY ts")
    loss = q("SELECT step, loss FROM train_steps WHERE loss IS NOT NULL ORDER BY step")
    deaths = q("SELECT epoch(ts) AS t, proc FROM actors WHERE event = 'died' ORDER BY ts")
    died_at = _col(deaths, "t") - start if deaths.num_rows else np.array([])

    fig, (ax_r, ax_l) = plt.subplots(2, 1, figsize=(9, 6.5))
    fig.suptitle(f"run {run_dir.name}")
    if rew.num_rows:
        t, y = _binned(_col(rew, "t") - start, _col(rew, "reward"))
        ax_r.plot(t, y, color="tab:blue", lw=1.5)
        for d in died_at:
            ax_r.axvline(d, color="tab:red", ls="--", lw=1)
        ax_r.set_title(f"rollouts/reward (mean per bin, {rew.num_rows:,} rollouts"
                       f"{f', {len(died_at)} proc death{_s(len(died_at))} dashed' if len(died_at) else ''})")
    else:
        ax_r.text(0.5, 0.5, "no rollouts rows", ha="center", va="center", transform=ax_r.transAxes)
    ax_r.set_xlabel("seconds since run start")
    ax_r.set_ylabel("reward")
    if loss.num_rows:
        s, y = _binned(_col(loss, "step"), _col(loss, "loss"))
        ax_l.plot(s, y, color="tab:orange", lw=1.5)
        ax_l.set_title(f"train/loss ({loss.num_rows:,} steps)")
    else:
        ax_l.text(0.5, 0.5, "no train_steps rows", ha="center", va="center", transform=ax_l.transAxes)
    ax_l.set_xlabel("optimiser step")
    ax_l.set_ylabel("loss")
    for ax in (ax_r, ax_l):
        ax.grid(alpha=0.3)
    fig.tight_layout()
    path = Path(out) if out else run_dir / "curves.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_main(argv: list[str]) -> int:
    """``rlmesh plot [RUN] [--out FILE]``: prints the PNG's path."""
    p = argparse.ArgumentParser(prog="rlmesh plot", description="reward and loss curves of a run, as PNG")
    p.add_argument("run", nargs="?", default=None, help="run id, 'latest' (default), run dir or .duckdb file")
    p.add_argument("--out", help="PNG path (default runs/<run>/curves.png)")
    a = p.parse_args(argv)
    try:
        print(plot_run(a.run, a.out))
    except (TelemetryError, ImportError, FileNotFoundError) as exc:
        print(f"rlmesh plot: {exc}", file=sys.stderr)
        return 1
    return 0
