"""Types and schema rules: which values fit which column, and the error when one does not.

The built-in tables themselves are declared in :mod:`rlmesh.telemetry.catalog` (and
re-exported here). User tables have no declaration: they are created from the first batch that reaches
the service, with types inferred from the values. Later batches may add columns
(earlier rows read NULL) but a value whose type differs from the column's raises
:class:`SchemaError` naming the table, the column and both types.
"""

from __future__ import annotations

import datetime as _dt

from rlmesh.telemetry.errors import TelemetryError


class SchemaError(TelemetryError, TypeError):
    """A row's value does not fit the column's type (never coerced, never dropped silently)."""

    def __init__(self, table: str, column: str, expected: str, got: str, hint: str = "", origin: str = ""):
        self.table, self.column, self.expected, self.got, self.hint = table, column, expected, got, hint
        self.origin = origin
        """Who recorded the refused row (``gen[1]``, ``controller``); '' where the check ran in the caller."""
        msg = (
            f"telemetry table {table!r} column {column!r} has type {expected} "
            f"but a row carries {got}"
        )
        hint = hint or f"record {column}= with one type throughout, or use a new column name"
        where = f" (a row recorded by {origin}: kept in _rejected, the other rows stored)" if origin else ""
        super().__init__(f"{msg}; {hint}{where}")

    def recorded_by(self, origin: str) -> SchemaError:
        """The same error, naming who recorded the refused row."""
        return SchemaError(self.table, self.column, self.expected, self.got, self.hint, origin)


from rlmesh.telemetry.catalog import AUTO, AUTO_NAMES, BUILTIN, DOCUMENTED, REJECTED_TABLE, VIEW_SQL, Column, Table  # noqa: E402 - re-exports, after this module's own names

__all__ = ["AUTO", "AUTO_NAMES", "BUILTIN", "DOCUMENTED", "REJECTED_TABLE", "VIEW_SQL", "Column", "SchemaError", "Table",
           "builtin_ddl", "check_table_name", "describe_column", "fits", "kind_of", "qident", "sql_type_of_kind"]

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
