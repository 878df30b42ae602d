"""Table declarations: every built-in table's typed columns and what each one means.

Why one place: the tables are the contract between the framework (which fills them)
and the user (who queries them). ``docs/telemetry.md`` and ``rlmesh sql RUN --schema``
are both generated from, or checked against, :data:`BUILTIN`.

User tables have no declaration: they are created from the first batch that reaches
the service, with types inferred from the values. Later batches may add columns
(earlier rows read NULL) but a value whose type differs from the column's raises
:class:`SchemaError` naming the table, the column and both types.
"""

from __future__ import annotations

import datetime as _dt
from dataclasses import dataclass

from rlmesh.telemetry.errors import TelemetryError


class SchemaError(TelemetryError, TypeError):
    """A row's value does not fit the column's type (never coerced, never dropped silently)."""

    def __init__(self, table: str, column: str, expected: str, got: str, hint: str = ""):
        self.table, self.column, self.expected, self.got = table, column, expected, got
        msg = (
            f"telemetry table {table!r} column {column!r} has type {expected} "
            f"but a row carries {got}"
        )
        hint = hint or f"record {column}= with one type throughout, or use a new column name"
        super().__init__(f"{msg}; {hint}")


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # DuckDB type
    doc: str


@dataclass(frozen=True)
class Table:
    name: str
    doc: str
    columns: tuple[Column, ...]
    filled_by: str = "the framework"

    def column(self, name: str) -> Column | None:
        for c in self.columns:
            if c.name == name:
                return c
        return None


def _c(name: str, type_: str, doc: str) -> Column:
    return Column(name, type_, doc)


#: Added to every row of every table. ``mesh``/``rank``/``proc``/``host`` come from
#: ``rm.context()`` inside an actor; in the controller they are ``controller``, ``-1``,
#: ``controller`` and the controller's host name. A row may set them itself (the
#: ``actors`` table does, so that its rows name the proc they describe).
AUTO: tuple[Column, ...] = (
    _c("run_id", "VARCHAR", "id of the run (directory name under runs/)"),
    _c("ts", "TIMESTAMPTZ", "when the row was recorded (UTC, microseconds)"),
    _c("mesh", "VARCHAR", "mesh name of the recording actor; 'controller' in the controller"),
    _c("rank", "BIGINT", "rank of the recording actor in its mesh; -1 in the controller"),
    _c("proc", "VARCHAR", "proc id (stable across restarts); 'controller' in the controller"),
    _c("host", "VARCHAR", "host name of the recording process"),
)
AUTO_NAMES = frozenset(c.name for c in AUTO)

_T = Table
BUILTIN: dict[str, Table] = {t.name: t for t in [
    _T("runs", "one row per run: what ran, with which config, and how it ended", (
        _c("id", "VARCHAR", "run id"),
        _c("config", "JSON", "the run's config (rm.telemetry.set_config), as JSON"),
        _c("start_ts", "TIMESTAMPTZ", "when the run started"),
        _c("end_ts", "TIMESTAMPTZ", "when it ended; NULL while running or if the controller was killed"),
        _c("status", "VARCHAR", "running | ok | failed (an exception ended the controller)"),
        _c("argv", "VARCHAR", "the controller's command line"),
        _c("pid", "BIGINT", "controller pid"),
        _c("host", "VARCHAR", "controller host"),
    ), "the telemetry service"),
    _T("actors", "proc lifecycle events from the runtime's supervisor; mesh/rank/proc/host name the proc", (
        _c("event", "VARCHAR", "spawned | died | restarted | stopped | gave_up"),
        _c("pid", "BIGINT", "OS pid of the process (NULL when unknown)"),
        _c("incarnation", "BIGINT", "0 for the first process of a proc, +1 per restart"),
        _c("exit_code", "BIGINT", "exit status of a dead proc (NULL if killed by a signal)"),
        _c("signal", "BIGINT", "signal that killed it (9 = SIGKILL), else NULL"),
        _c("reason", "VARCHAR", "why, in words (e.g. 'heartbeat timeout')"),
        _c("actors", "VARCHAR", "comma-separated ids of the actors hosted by the proc"),
    ), "the runtime's event sink (controller)"),
    _T("spans", "one row per endpoint call, as seen by the proc that served it", (
        _c("actor_id", "VARCHAR", "id of the serving actor"),
        _c("endpoint", "VARCHAR", "endpoint name"),
        _c("caller", "VARCHAR", "who called: 'controller' or the calling actor's id"),
        _c("start_ts", "TIMESTAMPTZ", "when the call started"),
        _c("duration_s", "DOUBLE", "wall time spent serving it"),
        _c("outcome", "VARCHAR", "ok | error"),
        _c("error", "VARCHAR", "exception type and message when outcome = 'error'"),
        _c("bytes_in", "BIGINT", "argument payload size"),
        _c("bytes_out", "BIGINT", "result payload size"),
        _c("weight", "BIGINT", "calls this row stands for (>1 when hot calls are sampled); use sum(weight) to count"),
    ), "the worker's span sink"),
    _T("rollouts", "one row per rollout (episode or completion) from a generator", (
        _c("rollout_id", "VARCHAR", "unique id of the rollout"),
        _c("policy_version", "BIGINT", "weight version that produced it"),
        _c("reward", "DOUBLE", "total reward"),
        _c("length", "BIGINT", "steps (env) or tokens (LLM)"),
        _c("env", "VARCHAR", "environment or task name"),
        _c("duration_s", "DOUBLE", "time to produce it"),
    ), "rlmesh.rl generators"),
    _T("rewards", "one row per scored rollout from a reward actor", (
        _c("rollout_id", "VARCHAR", "rollout scored"),
        _c("reward", "DOUBLE", "score"),
        _c("scorer", "VARCHAR", "reward function or model"),
        _c("duration_s", "DOUBLE", "time to score it"),
    ), "rlmesh.rl reward actors"),
    _T("train_steps", "one row per optimiser step", (
        _c("step", "BIGINT", "optimiser step"),
        _c("policy_version", "BIGINT", "weight version after the step"),
        _c("loss", "DOUBLE", "total loss"),
        _c("lr", "DOUBLE", "learning rate"),
        _c("grad_norm", "DOUBLE", "gradient norm before clipping"),
        _c("samples", "BIGINT", "samples in the batch"),
        _c("duration_s", "DOUBLE", "wall time of the step"),
        _c("metrics", "JSON", "other namespaced metrics, e.g. {\"losses/approx_kl\": 0.01}"),
    ), "rlmesh.rl trainers"),
    _T("weight_syncs", "one row per weight transfer to one subscriber", (
        _c("name", "VARCHAR", "published weights name, e.g. 'policy'"),
        _c("version", "BIGINT", "version transferred"),
        _c("transport", "VARCHAR", "shm | cuda_ipc | rdma | tcp"),
        _c("bytes", "BIGINT", "bytes moved"),
        _c("duration_s", "DOUBLE", "transfer time"),
        _c("ok", "BOOLEAN", "false when a checksum failed and the version was rejected"),
    ), "rlmesh.weights"),
    _T("host_health", "per host, every second: CPU, memory and load (psutil)", (
        _c("cpu_pct", "DOUBLE", "whole-host CPU utilisation, 0-100"),
        _c("mem_total", "BIGINT", "physical memory, bytes"),
        _c("mem_available", "BIGINT", "memory available to new work, bytes"),
        _c("mem_used_pct", "DOUBLE", "percent of memory in use"),
        _c("swap_used", "BIGINT", "swap in use, bytes"),
        _c("rss", "BIGINT", "resident memory of this job's processes on the host (sampler and its children), bytes"),
        _c("load_1m", "DOUBLE", "1-minute load average"),
        _c("load_5m", "DOUBLE", "5-minute load average"),
        _c("load_15m", "DOUBLE", "15-minute load average"),
    ), "one health sampler per host"),
    _T("gpu_health", "per GPU, every second (NVML); no GPU means no rows, never fake ones", (
        _c("gpu", "BIGINT", "NVML device index"),
        _c("uuid", "VARCHAR", "GPU UUID"),
        _c("name", "VARCHAR", "product name"),
        _c("util_pct", "DOUBLE", "GPU (SM) utilisation, 0-100"),
        _c("mem_util_pct", "DOUBLE", "memory-controller utilisation, 0-100"),
        _c("mem_used", "BIGINT", "device memory used, bytes"),
        _c("mem_total", "BIGINT", "device memory, bytes"),
        _c("temp_c", "DOUBLE", "core temperature, Celsius"),
        _c("power_w", "DOUBLE", "power draw, watts"),
        _c("sm_clock_mhz", "BIGINT", "current SM clock"),
        _c("ecc_corrected", "BIGINT", "volatile corrected ECC errors (NULL where ECC is off)"),
        _c("ecc_uncorrected", "BIGINT", "volatile uncorrected ECC errors (NULL where ECC is off)"),
        _c("xid", "BIGINT", "last XID error seen since the previous sample, else NULL"),
        _c("xid_count", "BIGINT", "XID errors seen since the previous sample"),
    ), "one health sampler per host"),
]}

#: Not filled on purpose: rows the service could not store (type mismatch), kept so nothing is lost silently.
REJECTED_TABLE = Table("_rejected", "rows that did not fit their table's types, kept with the reason", (
    _c("run_id", "VARCHAR", "id of the run"),
    _c("ts", "TIMESTAMPTZ", "when the service refused the rows"),
    _c("table_name", "VARCHAR", "table the rows were meant for"),
    _c("reason", "VARCHAR", "the schema error, naming column and both types"),
    _c("row", "VARCHAR", "the row, as JSON"),
), "the telemetry service")
DOCUMENTED: dict[str, Table] = {**BUILTIN, REJECTED_TABLE.name: REJECTED_TABLE}

# Which Python value kinds fit a declared DuckDB type. int fits DOUBLE (lossless for
# every value a metric realistically holds); nothing else is converted.
_FITS: dict[str, frozenset[str]] = {
    "VARCHAR": frozenset({"str"}),
    "JSON": frozenset({"str", "dict", "list"}),
    "BIGINT": frozenset({"int"}),
    "DOUBLE": frozenset({"float", "int"}),
    "BOOLEAN": frozenset({"bool"}),
    "TIMESTAMPTZ": frozenset({"datetime", "float", "int"}),
    "BLOB": frozenset({"bytes"}),
}

_KIND_TO_SQL = {"str": "VARCHAR", "int": "BIGINT", "float": "DOUBLE", "bool": "BOOLEAN",
                "bytes": "BLOB", "datetime": "TIMESTAMPTZ"}


def kind_of(value: object) -> str:
    """A coarse type name for a Python value: str, int, float, bool, bytes, datetime, list, dict, none."""
    t = type(value)
    if t is float:
        return "float"
    if t is int:
        return "int"
    if t is str:
        return "str"
    if t is bool:
        return "bool"
    if value is None:
        return "none"
    return _slow_kind(value)


def _slow_kind(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    if isinstance(value, str):
        return "str"
    if isinstance(value, (bytes, bytearray, memoryview)):
        return "bytes"
    if isinstance(value, _dt.datetime):
        return "datetime"
    if isinstance(value, (list, tuple)):
        return "list"
    if isinstance(value, dict):
        return "dict"
    mod = type(value).__module__
    if mod == "numpy" and getattr(value, "ndim", 1) == 0:
        return kind_of(value.item())  # type: ignore[attr-defined]
    return f"unsupported:{mod}.{type(value).__qualname__}"


def sql_type_of_kind(kind: str) -> str:
    """The DuckDB type a user table column gets when its first value has this kind."""
    return _KIND_TO_SQL.get(kind, kind.upper())


def fits(sql_type: str, kind: str) -> bool:
    """Whether a value of ``kind`` may go into a column of ``sql_type`` without coercion."""
    if kind == "none":
        return True
    allowed = _FITS.get(sql_type.upper())
    if allowed is None:  # nested user types (LIST, STRUCT): the service checks them
        return kind in ("list", "dict")
    return kind in allowed


def qident(name: str) -> str:
    """A SQL identifier, quoted so that any table or column name (``rollout/reward``, quotes) is safe."""
    return '"' + name.replace('"', '""') + '"'


def check_table_name(table: object) -> str:
    """Table names are non-empty strings without NUL, at most 120 characters; anything else is refused here."""
    if not isinstance(table, str) or not table or "\x00" in table or len(table) > 120:
        raise ValueError(f"telemetry table name {table!r} is not usable: give a short non-empty string, "
                         "e.g. record('rollouts', ...) or record('eval/gsm8k', ...)")
    if table.startswith("_"):
        raise ValueError(f"telemetry table name {table!r}: names starting with '_' are reserved for rlmesh")
    return table


def builtin_ddl(table: Table) -> str:
    """``CREATE TABLE`` for a built-in table: the automatic columns, then its own."""
    cols = [c for c in AUTO if table.column(c.name) is None] + list(table.columns)
    body = ", ".join(f"{qident(c.name)} {c.type}" for c in cols)
    return f"CREATE TABLE IF NOT EXISTS {qident(table.name)} ({body})"


def describe_column(table: str, column: str) -> str:
    """The documented meaning of a column, or '' for user tables and columns."""
    t = DOCUMENTED.get(table)
    if column in AUTO_NAMES and (t is None or t.column(column) is None):
        return next(c.doc for c in AUTO if c.name == column)
    c = t.column(column) if t else None
    return c.doc if c else ""
