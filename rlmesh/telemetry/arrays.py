"""Arrow arrays from Python values without pyarrow's conversion layer, which imports pandas.

Why: every pyarrow conversion of Python objects (``pa.array``, ``pa.scalar``, even of a numpy
array) first asks its pandas shim whether the value is a pandas object, and that imports pandas:
0.25 s of CPU and ~50 MB in every proc at its first telemetry flush, or in the start-up template
before it forks. Telemetry's own columns are a few plain types, so they are built here from
their buffers (``pa.Array.from_buffers``), which does not touch the shim.

When: :func:`exact` returns ``None`` for any value that is not exactly of the column's type (an
``int`` in a float column, a ``bool`` in an int column, a ``str`` subclass...), and the caller then
falls back to ``pa.array``, so what is accepted, converted or refused stays pyarrow's rule.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

TS_TYPE = pa.timestamp("us", tz="UTC")

_NUMPY = {pa.int64(): np.int64, pa.float64(): np.float64, TS_TYPE: np.int64}
_NONE = type(None)


def _only(values: Sequence[Any], py_type: type) -> bool:
    """Every value is ``None`` or exactly ``py_type`` (``map(type)`` and a set: C speed, no generator)."""
    return set(map(type, values)) <= {py_type, _NONE}


def _validity(values: Sequence[Any]) -> tuple[pa.Buffer | None, int]:
    """The validity bitmap of ``values`` (``None`` entries are null), or ``None`` when none is null."""
    nulls = values.count(None)
    if not nulls:
        return None, 0
    valid = np.array([v is not None for v in values], dtype=bool)
    return pa.py_buffer(np.packbits(valid, bitorder="little")), nulls


def _numbers(type_: pa.DataType, values: Sequence[Any], py_type: type) -> pa.Array | None:
    if not _only(values, py_type):
        return None
    validity, nulls = _validity(values)
    if nulls:
        fill = 0 if py_type is int else 0.0
        values = [fill if v is None else v for v in values]
    try:
        data = np.array(values, dtype=_NUMPY[type_])
    except OverflowError:
        return None  # an int beyond int64: pyarrow says so
    return pa.Array.from_buffers(type_, len(values), [validity, pa.py_buffer(data)], null_count=nulls)


def _bools(values: Sequence[Any]) -> pa.Array | None:
    if not _only(values, bool):
        return None
    validity, nulls = _validity(values)
    flags = np.array([v is True for v in values] if nulls else values, dtype=bool)
    bits = np.packbits(flags, bitorder="little")
    return pa.Array.from_buffers(pa.bool_(), len(values), [validity, pa.py_buffer(bits)], null_count=nulls)


def _binary(type_: pa.DataType, values: Sequence[Any], py_type: type) -> pa.Array | None:
    if not _only(values, py_type):
        return None
    validity, nulls = _validity(values)
    empty = py_type()  # "" or b"": a null's bytes
    parts = [empty if v is None else v for v in values] if nulls else values
    if py_type is str:
        joined = "".join(parts)
        if joined.isascii():  # one encode, and a character is a byte: lengths are the offsets
            data = joined.encode()
        else:
            try:
                parts = [v.encode() for v in parts]
            except UnicodeEncodeError:
                return None  # a lone surrogate: pyarrow's error names it
            data = b"".join(parts)
    else:
        data = b"".join(parts)
    offsets = np.zeros(len(parts) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, parts), dtype=np.int64, count=len(parts)), out=offsets[1:])
    if offsets[-1] >= 2**31:
        return None  # beyond 32-bit offsets: pyarrow picks a large type or refuses
    return pa.Array.from_buffers(type_, len(parts), [validity, pa.py_buffer(offsets.astype(np.int32)),
                                                     pa.py_buffer(data)], null_count=nulls)


def exact(values: Sequence[Any], type_: pa.DataType) -> pa.Array | None:
    """``values`` as an array of ``type_`` if every one is ``None`` or exactly that type's Python type
    (``int`` for int64 and for timestamps in microseconds, ``float`` for float64, ``bool``, ``str``
    for string, ``bytes`` for binary); else ``None`` (convert with ``pa.array``, which decides what
    else it accepts)."""
    if type_ == pa.int64() or type_ == TS_TYPE:  # timestamps: int microseconds since the epoch
        return _numbers(type_, values, int)
    if type_ == pa.float64():
        return _numbers(type_, values, float)
    if type_ == pa.bool_():
        return _bools(values)
    if type_ == pa.string():
        return _binary(type_, values, str)
    if type_ == pa.binary():
        return _binary(type_, values, bytes)
    return None


_INFERRED = {int: pa.int64(), float: pa.float64(), bool: pa.bool_(), str: pa.string(), bytes: pa.binary()}


def inferred(values: Sequence[Any]) -> pa.Array:
    """``values`` of an undeclared column: built from buffers when all that are not ``None`` have one
    plain type (``int``, ``float``, ``bool``, ``str``, ``bytes``), the type ``pa.array`` would infer
    for them; else ``pa.array`` infers (mixed numbers, lists, dicts, all ``None``)."""
    first = next((v for v in values if v is not None), None)
    type_ = _INFERRED.get(type(first))
    out = exact(values, type_) if type_ is not None else None
    return out if out is not None else pa.array(values)


def array(values: Sequence[Any], type_: pa.DataType) -> pa.Array:
    """``values`` as ``type_``: built from buffers where :func:`exact` can, else by ``pa.array``."""
    out = exact(values, type_)
    return out if out is not None else pa.array(values, type=type_)


def timestamps(micros: np.ndarray) -> pa.Array:
    """``timestamp[us, UTC]`` from int64 microseconds since the epoch (no nulls)."""
    data = np.ascontiguousarray(micros, dtype=np.int64)
    return pa.Array.from_buffers(TS_TYPE, len(data), [None, pa.py_buffer(data)])


def repeat(value: Any, n: int, type_: pa.DataType) -> pa.Array:
    """``n`` copies of one value (a run's id, a proc's name on every row of a batch)."""
    if type_ == TS_TYPE and type(value) is int:
        return timestamps(np.full(n, value, dtype=np.int64))
    raw = None
    if type(value) is str and type_ == pa.string():
        try:
            raw = value.encode()
        except UnicodeEncodeError:
            pass  # a lone surrogate: pa.array below says what is wrong
    elif type(value) is bytes and type_ == pa.binary():
        raw = value
    if raw is not None and len(raw) * n < 2**31:
        offsets = np.arange(n + 1, dtype=np.int32) * len(raw)
        return pa.Array.from_buffers(type_, n, [None, pa.py_buffer(offsets), pa.py_buffer(raw * n)])
    return array([value] * n, type_)
