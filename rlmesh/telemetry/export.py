"""Mirror a run's curves to TensorBoard event files and W&B (``telemetry.export=tensorboard,wandb``).

Why a mirror and not a second source of truth: RL users already watch TensorBoard or W&B
(CleanRL, SB3, RLlib all log there). The run's DuckDB stays the record; an :class:`Exporter`
thread in the controller reads new rows of ``evals``, ``train_steps`` and ``rollouts`` through
the read-only query path every ``interval_s`` (cursor: DuckDB's ``rowid``, so a late row is
never skipped nor sent twice) and writes them as scalars, named as CleanRL names them:

============================  ===========================================  ==================
tag                           value                                        step (x)
============================  ===========================================  ==================
``eval/<metric>``             ``evals.value`` (e.g. ``eval/mean_return``)  ``evals.env_steps``
``charts/episodic_return``    ``rollouts.reward`` (rows with episodes)     env steps generated
``charts/SPS``                env steps generated / seconds since start    env steps generated
``losses/loss``               ``train_steps.loss``                         env steps trained
``losses/*``, ``train/*``     every key of ``train_steps.metrics``         env steps trained
``charts/learning_rate``      ``train_steps.lr``                           env steps trained
``perf/train_step_s``         ``train_steps.duration_s``                   env steps trained
============================  ===========================================  ==================

Wall times are the rows' own ``ts``. TensorBoard files go to ``runs/<run>/tensorboard/``
(``tensorboard --logdir runs`` shows every run); W&B runs ``offline`` unless ``WANDB_MODE``
says otherwise, into ``runs/<run>/wandb/`` (``wandb sync`` uploads it later).
"""

from __future__ import annotations

import json
import logging
import os
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

logger = logging.getLogger(__name__)

TB_DIR = "tensorboard"


@dataclass(frozen=True)
class Scalar:
    tag: str
    value: float
    step: int
    wall_time: float


class TensorBoardSink:
    """Event files written with TensorBoard's own writer (readable by a stock ``tensorboard --logdir``)."""

    def __init__(self, logdir: Path):
        try:  # heavy optional dependency: only runs that export to TensorBoard load it
            from tensorboard.compat.proto.event_pb2 import Event  # deferred: optional extra rlmesh[dashboard] (TensorBoard export only)
            from tensorboard.compat.proto.summary_pb2 import Summary  # deferred: optional extra rlmesh[dashboard] (TensorBoard export only)
            from tensorboard.summary.writer.event_file_writer import EventFileWriter  # deferred: optional extra rlmesh[dashboard] (TensorBoard export only)
        except ImportError as exc:
            raise ImportError("telemetry.export=tensorboard needs tensorboard: pip install tensorboard "
                              "(or pip install 'rlmesh[dashboard]')") from exc
        self._event, self._summary = Event, Summary
        logdir.mkdir(parents=True, exist_ok=True)
        self.logdir = logdir
        self._writer = EventFileWriter(str(logdir))

    def write(self, scalars: list[Scalar]) -> None:
        for s in scalars:
            summary = self._summary(value=[self._summary.Value(tag=s.tag, simple_value=s.value)])
            self._writer.add_event(self._event(wall_time=s.wall_time, step=s.step, summary=summary))
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """A W&B run (offline unless ``WANDB_MODE`` is set), every tag plotted against ``global_step``."""

    def __init__(self, run_dir: Path, run_id: str, config: Any = None):
        try:  # heavy optional dependency: only runs that export to W&B load it
            import wandb  # deferred: optional, W&B export only
        except ImportError as exc:
            raise ImportError("telemetry.export=wandb needs wandb: pip install wandb (it runs offline unless "
                              "WANDB_MODE=online and you are logged in)") from exc
        self._wandb = wandb
        self._run = wandb.init(project=os.environ.get("WANDB_PROJECT", "rlmesh"), name=run_id, id=run_id,
                               dir=str(run_dir), mode=os.environ.get("WANDB_MODE", "offline"), config=config,  # type: ignore[arg-type]  # wandb checks mode
                               resume="allow")
        self._run.define_metric("global_step")
        self._run.define_metric("*", step_metric="global_step")

    def write(self, scalars: list[Scalar]) -> None:
        for s in scalars:
            self._run.log({s.tag: s.value, "global_step": s.step})

    def close(self) -> None:
        self._run.finish()


class Exporter:
    """Polls the run's tables by ``rowid`` and hands new scalars to the sinks (a daemon thread)."""

    def __init__(self, query: Callable[[str], Any], sinks: list[Any], interval_s: float = 2.0):
        self.query = query
        self.sinks = sinks
        self.interval_s = interval_s
        self._cursor = {"evals": -1, "train_steps": -1, "rollouts": -1}
        self._trained = 0
        self._generated = 0
        self._t0: float | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.exported = 0

    def start(self) -> "Exporter":
        self._thread = threading.Thread(target=self._loop, name="rlmesh-telemetry-export", daemon=True)
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self.poll()
            except Exception:  # noqa: BLE001 - exporting is a mirror: the run goes on, said once per failure
                logger.warning("telemetry export: reading new rows failed; will retry", exc_info=True)

    def stop(self) -> None:
        """Export what is left, then close the sinks (call while the run's service still answers)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            self.poll()
        finally:
            for s in self.sinks:
                s.close()

    def _new(self, table: str, cols: str) -> list[dict[str, Any]]:
        rows = self.query(f"SELECT rowid AS _rid, epoch(ts) AS _wall, {cols} FROM {table} "
                          f"WHERE rowid > {int(self._cursor[table])} ORDER BY rowid").to_pylist()
        if rows:
            self._cursor[table] = rows[-1]["_rid"]
        return rows

    def poll(self) -> int:
        """Export the rows that arrived since the last poll; returns how many scalars were written."""
        if self._t0 is None:
            t0 = self.query("SELECT min(epoch(start_ts)) AS t0 FROM runs").to_pylist()
            self._t0 = t0[0]["t0"] if t0 and t0[0]["t0"] is not None else None
        out: list[Scalar] = []
        for r in self._new("evals", "metric, value, env_steps, policy_version"):
            if r["value"] is not None:
                step = r["env_steps"] if r["env_steps"] is not None else r["policy_version"] or 0
                out.append(Scalar(f"eval/{r['metric']}", float(r["value"]), int(step), r["_wall"]))
        for r in self._new("rollouts", "reward, length"):
            self._generated += int(r["length"] or 0)
            if r["reward"] is not None:
                out.append(Scalar("charts/episodic_return", float(r["reward"]), self._generated, r["_wall"]))
            if self._t0 is not None and r["_wall"] > self._t0:
                out.append(Scalar("charts/SPS", self._generated / (r["_wall"] - self._t0), self._generated, r["_wall"]))
        for r in self._new("train_steps", "loss, lr, duration_s, samples, metrics"):
            self._trained += int(r["samples"] or 0)
            step, wall = self._trained, r["_wall"]
            for tag, value in (("losses/loss", r["loss"]), ("charts/learning_rate", r["lr"]),
                               ("perf/train_step_s", r["duration_s"])):
                if value is not None:
                    out.append(Scalar(tag, float(value), step, wall))
            metrics = json.loads(r["metrics"]) if isinstance(r["metrics"], str) else (r["metrics"] or {})
            for tag, value in metrics.items():
                if tag == "charts/episodic_return" or tag == "losses/loss":
                    continue  # the rollouts' own rows give it (per rollout, at the step it was generated)
                if isinstance(value, (int, float)) and value == value:
                    out.append(Scalar(tag, float(value), step, wall))
        if out:
            for s in self.sinks:
                s.write(out)
        self.exported += len(out)
        return len(out)


def start_export(targets: list[str], run_dir: Path, run_id: str, config: Any = None,
                 interval_s: float = 2.0) -> Exporter | None:
    """Start an :class:`Exporter` on ``run_dir`` for ``targets`` (``tensorboard``/``wandb``); None for none."""
    if not targets:
        return None
    from rlmesh.telemetry.reader import query_run_dir  # deferred: pyarrow/DuckDB load on first use (rlmesh.telemetry import-cost rule)

    sinks: list[Any] = []
    for t in targets:
        sinks.append(TensorBoardSink(run_dir / TB_DIR) if t == "tensorboard" else WandbSink(run_dir, run_id, config))
    return Exporter(lambda sql: query_run_dir(run_dir, sql), sinks, interval_s).start()
