"""Chart definitions shared by ``rlmesh plot`` (matplotlib, a PNG) and ``rlmesh dashboard`` (plotly.js, live).

Why one declarative list: the PNG and the page must always agree. A :class:`ChartSpec` is
SQL plus axes; :func:`evaluate` runs the SQL through the read-only query path and turns the
rows into :class:`ChartData` (named series of x/y), which each renderer only draws.

The SQL of a spec returns a column ``x``, optionally ``t`` (seconds since the run started,
used to break lines at stalls) and ``series`` (a name per row, then one value column ``y``);
every other column is a series of its own, named by the column. ``{bins}`` in the SQL is the
number of points to aggregate to, so a run with millions of rows answers with a few hundred.

Lines are broken (a ``None`` between two points) where the wall time between neighbours is much
longer than usual: a stalled run shows a gap, not a straight line pretending to be data.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import Decimal
from enum import StrEnum
from typing import Any, Callable

BINS = 400
"""Points per curve at most: enough for a wide screen, cheap to send every refresh."""
GAP_FACTOR = 5.0
"""A step in ``t`` longer than this many times the median step is a stall (the line breaks)."""
MIN_GAP_S = 3.0
"""...and never a stall when shorter than this many seconds."""

_T0 = ("(SELECT coalesce((SELECT min(epoch(start_ts)) FROM runs), "
       "(SELECT min(epoch(ts)) FROM rollouts), 0))")
_T0_US = ("(SELECT coalesce((SELECT min(epoch_us(start_ts)) FROM runs), "
          "(SELECT min(epoch_us(ts)) FROM rollouts), 0))")


class ChartKind(StrEnum):
    """How a chart is drawn."""

    LINE = "line"
    MARKERS = "markers"
    BAR = "bar"


class Page(StrEnum):
    """Which dashboard page shows a chart (``rlmesh plot`` draws the ``run`` page's ``plot=True`` ones)."""

    RUN = "run"
    HEALTH = "health"
    MESHES = "meshes"


@dataclass(frozen=True)
class ChartSpec:
    id: str
    title: str
    sql: str
    x_label: str
    y_label: str
    page: Page = Page.RUN
    kind: ChartKind = ChartKind.LINE
    break_gaps: bool = True
    """Break lines where ``t`` jumps (a stall); off for axes where time does not run along x."""
    plot: bool = False
    """Also a panel of ``rlmesh plot``."""
    x_axis: str = "env_steps"
    """What x is: ``env_steps``, ``time``, ``policy_version``, ``lag`` (panels sharing it share an axis)."""
    x: str = "x"
    """The result column drawn along x."""
    y: tuple[str, ...] = ()
    """The value columns drawn (each a series); empty = every column but x, t and series. Two specs
    with the same SQL and different x/y share one query per refresh (see :func:`memoized`)."""

    def render_sql(self, bins: int = BINS) -> str:
        return self.sql.replace("{bins}", str(int(bins))).replace("{t0_us}", _T0_US).replace("{t0}", _T0)


@dataclass
class Series:
    name: str
    x: list[Any]
    y: list[Any]


@dataclass
class ChartData:
    """What a renderer draws: the spec's labels and the series, lines already broken at gaps."""

    id: str
    title: str
    kind: ChartKind
    x_label: str
    y_label: str
    series: list[Series] = field(default_factory=list)
    rows: int = 0
    x_axis: str = "env_steps"

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "title": self.title, "kind": str(self.kind), "x_label": self.x_label,
                "y_label": self.y_label, "rows": self.rows, "x_axis": self.x_axis,
                "series": [{"name": s.name, "x": s.x, "y": s.y} for s in self.series]}


def _clean(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, Decimal):  # sum() of BIGINT is a HUGEINT/DECIMAL in DuckDB
        return int(v) if v == v.to_integral_value() else float(v)
    return v


def break_at_gaps(x: list[Any], y: list[Any], t: list[float | None],
                  factor: float = GAP_FACTOR, min_gap_s: float = MIN_GAP_S) -> tuple[list[Any], list[Any]]:
    """Insert a ``None`` point between neighbours whose ``t`` differ by more than
    ``max(factor * median step, min_gap_s)``: renderers then leave a gap there."""
    steps = sorted(b - a for a, b in zip(t, t[1:]) if a is not None and b is not None and b >= a)
    if not steps:
        return x, y
    median = steps[len(steps) // 2]
    limit = max(factor * median, min_gap_s)
    ox, oy = [x[0]], [y[0]]
    for i in range(1, len(x)):
        a, b = t[i - 1], t[i]
        if a is not None and b is not None and b - a > limit:
            ox.append(None)
            oy.append(None)
        ox.append(x[i])
        oy.append(y[i])
    return ox, oy


def to_chart(spec: ChartSpec, tbl: Any, series_prefix: str = "") -> ChartData:
    """Turn a query result (pyarrow Table with ``x`` [``t``, ``series``] and value columns) into series."""
    cols = {name: [_clean(v) for v in tbl.column(name).to_pylist()] for name in tbl.column_names}
    data = ChartData(spec.id, spec.title, spec.kind, spec.x_label, spec.y_label, rows=tbl.num_rows,
                     x_axis=spec.x_axis)
    if spec.x not in cols:
        return data
    t = cols.get("t")
    x = cols[spec.x]
    if spec.y:
        cols = {k: v for k, v in cols.items() if k in spec.y or k == "series"}
    else:
        cols = {k: v for k, v in cols.items() if k not in (spec.x, "t")}
    groups: list[tuple[str, list[int]]]
    if "series" in cols:
        names = cols.pop("series")
        order: dict[str, list[int]] = {}
        for i, n in enumerate(names):
            order.setdefault(str(n), []).append(i)
        groups = list(order.items())
        value_cols = [("y", cols["y"])] if "y" in cols else []
    else:
        groups = [("", list(range(len(x))))]
        value_cols = list(cols.items())
    for gname, idx in groups:
        for cname, vals in value_cols:
            name = gname if gname and cname == "y" else (f"{gname} {cname}".strip() if gname else cname)
            sx = [x[i] for i in idx if vals[i] is not None]
            sy = [vals[i] for i in idx if vals[i] is not None]
            if spec.break_gaps and t is not None and spec.kind != ChartKind.BAR:
                st = [t[i] for i in idx if vals[i] is not None]
                sx, sy = break_at_gaps(sx, sy, st)
            data.series.append(Series(f"{series_prefix}{name}", sx, sy))
    return data


def memoized(query: Callable[[str], Any]) -> Callable[[str], Any]:
    """``query`` answering a repeated SQL text from memory: charts that share a query (the rollout
    bins feed both the return and the throughput charts) cost one scan per refresh."""
    seen: dict[str, Any] = {}

    def q(sql: str) -> Any:
        if sql not in seen:
            seen[sql] = query(sql)
        return seen[sql]

    return q


def evaluate(spec: ChartSpec, query: Callable[[str], Any], bins: int = BINS, series_prefix: str = "") -> ChartData:
    """Run ``spec`` with ``query`` (read-only SQL -> pyarrow Table) and shape the rows for drawing.

    A chart over a table the run's file does not have (a run recorded before that table existed,
    e.g. ``proc_health``) is empty, so one old run still shows every other chart."""
    try:
        tbl = query(spec.render_sql(bins))
    except Exception as exc:  # noqa: BLE001 - only "no such table" is an empty chart; anything else is raised
        if "Catalog Error: Table with name" not in str(exc):
            raise
        return ChartData(spec.id, spec.title, spec.kind, spec.x_label, spec.y_label, rows=0, x_axis=spec.x_axis)
    return to_chart(spec, tbl, series_prefix)


# --- the charts ---------------------------------------------------------------------------------

def _time_binned(table: str, value: str, series: str) -> str:
    """Mean of ``value`` per time bin and per ``series``, x = seconds since the run started.

    Integer microsecond bins and scalar subqueries (not a cross join): the cheapest plan DuckDB
    has for a scan of millions of rows; min/max of ``ts`` come from the table's statistics."""
    return f"""
WITH w AS (SELECT epoch_us(min(ts)) AS lo, greatest((epoch_us(max(ts)) - epoch_us(min(ts))) // {{bins}}, 1000) AS w
           FROM {table}),
b AS (SELECT (epoch_us(ts) - (SELECT lo FROM w)) // (SELECT w FROM w) AS bin, {series} AS series,
             (min(epoch_us(ts)) - {{t0_us}}) / 1e6 AS x, avg({value}) AS y FROM {table} GROUP BY bin, series)
SELECT x, y, x AS t, series FROM b ORDER BY series, x"""


_ROLLOUT_BINS = """
WITH w AS (SELECT epoch_us(min(ts)) AS lo, greatest((epoch_us(max(ts)) - epoch_us(min(ts))) // {bins}, 1000) AS w
           FROM rollouts),
b AS (SELECT (epoch_us(ts) - (SELECT lo FROM w)) // (SELECT w FROM w) AS bin, sum(length) AS steps,
             sum(reward * episodes) / nullif(sum(episodes) FILTER (WHERE reward IS NOT NULL), 0) AS reward,
             (max(epoch_us(ts)) - {t0_us}) / 1e6 AS t
      FROM rollouts GROUP BY bin)
SELECT sum(steps) OVER (ORDER BY bin) AS env_steps, t, reward AS "episodic return",
       steps / ((SELECT w FROM w) / 1e6) AS "env steps/s" FROM b ORDER BY bin"""
"""Rollouts in time bins: the return curve and the throughput curve read the same result."""

_TRAIN = """
WITH s AS (SELECT step, policy_version, loss, metrics, samples, duration_s, epoch(ts) - {t0} AS t,
                  sum(samples) OVER (ORDER BY step, ts) AS env_steps FROM train_steps),
b AS (SELECT max(env_steps) AS x, avg(loss) AS loss, arg_max(metrics, step) AS m, max(t) AS t FROM s
      GROUP BY step // (SELECT greatest((max(step) - min(step)) // {bins} + 1, 1) FROM train_steps))
"""

STALENESS_WINDOW = 50_000
"""The staleness histogram covers the latest rollouts only: an as-of join over every row of a long
run costs too much per refresh, and the current lag is what one watches."""


def _metric(name: str) -> str:
    """One key of the bin's last ``metrics`` JSON (the JSON of ~400 rows is parsed, not of every row)."""
    return f"TRY_CAST(json_extract_string(m, '$.\"{name}\"') AS DOUBLE)"


CHARTS: tuple[ChartSpec, ...] = (
    ChartSpec("eval_env_steps", "evaluation (greedy) vs env steps",
              "SELECT env_steps AS x, value AS y, metric AS series, epoch(ts) - {t0} AS t FROM evals "
              "WHERE env_steps IS NOT NULL ORDER BY env_steps, ts",
              "env steps trained", "eval metric", kind=ChartKind.LINE, plot=True),
    ChartSpec("reward_env_steps", "rollout episodic return vs env steps", _ROLLOUT_BINS,
              "env steps generated", "mean episodic return", plot=True, x="env_steps", y=("episodic return",)),
    ChartSpec("loss_env_steps", "training losses vs env steps",
              _TRAIN + "SELECT x, loss, " + _metric("losses/policy_loss") + " AS policy_loss, "
              + _metric("losses/value_loss") + " AS value_loss, t FROM b ORDER BY x",
              "env steps trained", "loss", plot=True),
    ChartSpec("eval_version", "evaluation (greedy) vs policy version",
              "SELECT policy_version AS x, value AS y, metric AS series FROM evals ORDER BY policy_version, ts",
              "policy version", "eval metric", break_gaps=False, x_axis="policy_version"),
    ChartSpec("reward_version", "rollout episodic return vs policy version",
              "SELECT min(policy_version) AS x, "
              "sum(reward * episodes) / nullif(sum(episodes) FILTER (WHERE reward IS NOT NULL), 0) AS \"episodic return\" "
              "FROM rollouts GROUP BY policy_version // (SELECT greatest((max(policy_version) - min(policy_version)) "
              "// {bins} + 1, 1) FROM rollouts) ORDER BY x",
              "policy version (of the weights that generated)", "mean episodic return", break_gaps=False,
              x_axis="policy_version"),
    ChartSpec("step_times", "train-step and weight-sync time vs policy version",
              "WITH w AS (SELECT greatest((max(policy_version) - min(policy_version)) // {bins} + 1, 1) AS w "
              "FROM train_steps), t AS (SELECT policy_version // (SELECT w FROM w) AS b, min(policy_version) AS x, "
              "avg(duration_s) * 1e3 AS train_ms FROM train_steps GROUP BY b), "
              "s AS (SELECT version // (SELECT w FROM w) AS b, min(version) AS x, avg(duration_s) * 1e3 AS sync_ms "
              "FROM weight_syncs GROUP BY b) SELECT coalesce(t.x, s.x) AS x, t.train_ms AS \"train step (ms)\", "
              "s.sync_ms AS \"weight sync (ms)\" FROM t FULL JOIN s USING (b) ORDER BY x",
              "policy version", "milliseconds", kind=ChartKind.MARKERS, break_gaps=False, x_axis="policy_version"),
    ChartSpec("throughput", "rollout throughput", _ROLLOUT_BINS,
              "seconds since run start", "env steps per second", x_axis="time", x="t", y=("env steps/s",)),
    ChartSpec("staleness", f"staleness: policy lag of the latest {STALENESS_WINDOW // 1000}k rollouts when made",
              "SELECT greatest(coalesce(t.policy_version, 0) - r.policy_version, 0) AS x, count(*) AS rollouts "
              "FROM (SELECT ts, policy_version FROM rollouts WHERE rowid > (SELECT max(rowid) FROM rollouts) - "
              f"{STALENESS_WINDOW}) r ASOF LEFT JOIN train_steps t ON r.ts >= t.ts GROUP BY 1 ORDER BY 1",
              "trainer version minus rollout version", "rollouts", kind=ChartKind.BAR, break_gaps=False, x_axis="lag"),
    ChartSpec("host_cpu", "host CPU", _time_binned("host_health", "cpu_pct", "host"),
              "seconds since run start", "CPU %", page=Page.HEALTH, x_axis="time"),
    ChartSpec("host_mem", "host memory in use", _time_binned("host_health", "mem_used_pct", "host"),
              "seconds since run start", "memory %", page=Page.HEALTH, x_axis="time"),
    ChartSpec("host_rss", "job resident memory", _time_binned("host_health", "rss / 2^30", "host"),
              "seconds since run start", "GiB", page=Page.HEALTH, x_axis="time"),
    ChartSpec("proc_rss", "resident memory per proc", _time_binned("proc_health", "rss / 2^30", "proc"),
              "seconds since run start", "GiB", page=Page.HEALTH, x_axis="time"),
    ChartSpec("host_load", "host load (1 min)", _time_binned("host_health", "load_1m", "host"),
              "seconds since run start", "load", page=Page.HEALTH, x_axis="time"),
    ChartSpec("gpu_util", "GPU utilisation", _time_binned("gpu_health", "util_pct", "host || ':' || gpu"),
              "seconds since run start", "SM %", page=Page.HEALTH, x_axis="time"),
    ChartSpec("gpu_mem", "GPU memory used", _time_binned("gpu_health", "mem_used / 2^30", "host || ':' || gpu"),
              "seconds since run start", "GiB", page=Page.HEALTH, x_axis="time"),
    ChartSpec("gpu_temp", "GPU temperature", _time_binned("gpu_health", "temp_c", "host || ':' || gpu"),
              "seconds since run start", "°C", page=Page.HEALTH, x_axis="time"),
    ChartSpec("gpu_power", "GPU power", _time_binned("gpu_health", "power_w", "host || ':' || gpu"),
              "seconds since run start", "W", page=Page.HEALTH, x_axis="time"),
    ChartSpec("deaths", "proc deaths (dashed lines on the env-steps charts)",
              "WITH d AS (SELECT ts, mesh || '[' || rank || '] ' || proc AS y FROM actors WHERE event = 'died'), "
              "r AS (SELECT max(ts) AS ts, sum(length) AS n FROM rollouts WHERE (SELECT count(*) FROM d) > 0 "
              "GROUP BY epoch_us(ts) // 100000), c AS (SELECT ts, sum(n) OVER (ORDER BY ts) AS env_steps FROM r) "
              "SELECT coalesce(c.env_steps, 0) AS x, d.y FROM d ASOF LEFT JOIN c ON d.ts >= c.ts ORDER BY d.ts",
              "env steps generated", "proc", kind=ChartKind.MARKERS, break_gaps=False),
    ChartSpec("proc_events", "proc events (deaths, restarts, injected faults)",
              "SELECT epoch(ts) - {t0} AS x, mesh || '[' || rank || '] ' || proc AS y, event AS series FROM actors "
              "WHERE event IN ('died', 'restarted', 'fault_injected', 'gave_up') ORDER BY ts",
              "seconds since run start", "proc", page=Page.MESHES, kind=ChartKind.MARKERS, break_gaps=False,
              x_axis="time"),
)
"""Every chart, in page order."""

BY_ID: dict[str, ChartSpec] = {c.id: c for c in CHARTS}

COMPARABLE = ("eval_env_steps", "reward_env_steps", "loss_env_steps", "eval_version", "reward_version", "throughput")
"""Charts the comparison page can overlay across runs."""


def on_page(page: Page) -> list[ChartSpec]:
    return [c for c in CHARTS if c.page == page and c.id != "deaths"]


def plot_panels() -> list[ChartSpec]:
    return [c for c in CHARTS if c.plot]


DEATHS = BY_ID["deaths"]
"""Marks, not a chart: where procs died, drawn as dashed lines on the env-steps charts."""
