"""``TelemetryConfig``: the typed settings of the telemetry layer (for Hydra presets and code).

Why environment variables underneath: workers are other processes, started by the
runtime, and inherit the controller's environment. :meth:`TelemetryConfig.apply` sets
them in the controller before the first ``spawn_procs`` so that every proc follows the
same settings; each variable can also be set by hand (see ``docs/telemetry.md``).
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

from rlmesh import settings
from rlmesh.telemetry.errors import TelemetryError

FLUSH_ENV = settings.TELEMETRY_FLUSH_S.name
EXPORT_TARGETS = ("tensorboard", "wandb")


class TelemetryConfigError(TelemetryError, ValueError):
    """A telemetry setting is out of range; the message names the setting and the fix."""


@dataclass
class TelemetryConfig:
    enabled: bool = settings.TELEMETRY.default
    """Record at all. False makes ``record()`` a no-op and starts no run (``RLMESH_TELEMETRY=0``)."""

    runs_dir: str = settings.RUNS_DIR.default
    """Where runs are written, relative to the working directory (``RLMESH_RUNS_DIR``)."""

    flush_interval_s: float = settings.TELEMETRY_FLUSH_S.default
    """How often each proc ships its buffered rows. Must stay under 0.9 s: rows reach the
    file within about flush + 0.1 s, and the durability promise is one second."""

    health_interval_s: float = settings.HEALTH_INTERVAL.default
    """Seconds between ``host_health``/``gpu_health`` samples (one sampler per host); 0 = off
    (``proc_health`` too)."""

    proc_health_interval_s: float = settings.PROC_HEALTH_INTERVAL.default
    """Seconds between each proc's ``proc_health`` sample of itself (RSS, CPU, threads, open
    files; ``RLMESH_PROC_HEALTH_INTERVAL``); 0 = off."""

    spans: bool = settings.SPANS.default
    """Record a ``spans`` row per endpoint call (``RLMESH_SPANS``)."""

    spans_max_per_s: float = settings.SPANS_MAX_PER_S.default
    """Span rows per second per (actor, endpoint) in each proc; calls beyond it are counted
    in the next row's ``weight`` instead of getting their own row."""

    dashboard: bool = False
    """Start ``rlmesh dashboard`` for the run (``rlmesh run``) and print its URL; it stops with the run."""

    dashboard_port: int = 0
    """Port of that dashboard on 127.0.0.1; 0 picks a free one."""

    export: str = "none"
    """Mirror evals, train steps and rollout statistics to ``tensorboard`` (event files in
    ``runs/<run>/tensorboard``) and/or ``wandb`` (offline unless ``WANDB_MODE`` says otherwise),
    comma-separated; ``none`` = off. See docs/dashboard.md."""

    def __post_init__(self) -> None:
        unknown = [t for t in self.export_targets() if t not in EXPORT_TARGETS]
        if unknown:
            raise TelemetryConfigError(
                f"telemetry.export={self.export!r}: unknown target {unknown[0]!r}; use none, "
                f"{', '.join(EXPORT_TARGETS)} or both comma-separated (telemetry.export='tensorboard,wandb')")
        for target in self.export_targets():
            if importlib.util.find_spec(target) is None:
                raise TelemetryConfigError(
                    f"telemetry.export={self.export!r} needs {target}, which is not installed: pip install {target}"
                    + (" (or pip install 'rlmesh[dashboard]')" if target == "tensorboard" else "")
                    + ", or drop it from telemetry.export")
        missing = [m for m in ("starlette", "uvicorn", "plotly") if importlib.util.find_spec(m) is None]
        if self.dashboard and missing:
            raise TelemetryConfigError(f"telemetry.dashboard=true needs {', '.join(missing)}: "
                                       "pip install 'rlmesh[dashboard]', or set telemetry.dashboard=false")
        if not 0 <= self.dashboard_port <= 65535:
            raise TelemetryConfigError(f"telemetry.dashboard_port={self.dashboard_port}: use 0 (a free port) to 65535")
        if not 0 < self.flush_interval_s <= 0.9:
            raise TelemetryConfigError(
                f"telemetry.flush_interval_s={self.flush_interval_s} must be in (0, 0.9] seconds, "
                "or rows could take longer than the promised 1 s to reach disk")
        if self.health_interval_s < 0:
            raise TelemetryConfigError(
                f"telemetry.health_interval_s={self.health_interval_s} must be >= 0 (0 turns sampling off)")
        if self.proc_health_interval_s < 0:
            raise TelemetryConfigError(
                f"telemetry.proc_health_interval_s={self.proc_health_interval_s} must be >= 0 (0 turns it off)")
        if self.spans_max_per_s <= 0:
            raise TelemetryConfigError(
                f"telemetry.spans_max_per_s={self.spans_max_per_s} must be > 0; set telemetry.spans=false "
                "to record no spans")
        if not self.runs_dir:
            raise TelemetryConfigError("telemetry.runs_dir is empty; use 'runs' or a path")

    def export_targets(self) -> list[str]:
        """``export`` as a list (``[]`` for none)."""
        return [t.strip().lower() for t in str(self.export or "").split(",") if t.strip() and t.strip().lower() != "none"]

    def env(self) -> dict[str, str]:
        """The environment variables this config stands for."""
        return {
            settings.TELEMETRY.name: "1" if self.enabled else "0",
            settings.RUNS_DIR.name: self.runs_dir,
            FLUSH_ENV: repr(self.flush_interval_s),
            settings.HEALTH_INTERVAL.name: repr(self.health_interval_s),
            settings.PROC_HEALTH_INTERVAL.name: repr(self.proc_health_interval_s),
            settings.SPANS.name: "1" if self.spans else "0",
            settings.SPANS_MAX_PER_S.name: repr(self.spans_max_per_s),
        }

    def apply(self) -> None:
        """Set the variables in this process (call before the first record or spawn_procs)."""
        os.environ.update(self.env())


def flush_interval_from_env() -> float:
    """``RLMESH_TELEMETRY_FLUSH_S``: out of (0, 0.9] it warns and gives the default."""
    return settings.TELEMETRY_FLUSH_S.get()
