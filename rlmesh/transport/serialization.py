"""Pickle protocol 5 with out-of-band buffers, so tensors and arrays are never copied into the pickle.

Why: a 64 MiB tensor argument must cross the wire at close to raw zmq bandwidth.
``dumps`` returns ``[header, buf1, buf2, ...]``: the header is a cloudpickle
stream (so classes defined in ``__main__`` or a notebook travel by value) and each
large buffer is a separate zmq frame sent without copying. ``loads`` rebuilds the
objects as views over the received frames.

CPU torch tensors are reduced to their raw bytes plus dtype/shape (any dtype,
bf16 included; non-contiguous inputs are made contiguous once). Tensors on other
devices are moved to CPU on send and restored to the same device on receipt when
that device exists there.
"""

from __future__ import annotations

import io
import pickle
import sys
import types
import warnings
from typing import Any

import cloudpickle

# Buffers smaller than this are cheaper to inline in the header than to frame.
OOB_THRESHOLD = 8 * 1024


class SerializationError(TypeError):
    """An object could not be pickled (or unpickled); the message names the offending type."""


def _torch():
    return sys.modules.get("torch")


def _rebuild_tensor(buf: Any, dtype: Any, shape: tuple, device: str, requires_grad: bool):
    import torch  # deferred: torch is heavy; only a tensor in a message loads it

    if isinstance(buf, pickle.PickleBuffer):
        buf = buf.raw()
    nbytes = memoryview(buf).nbytes
    if nbytes == 0:
        t = torch.empty(shape, dtype=dtype)
    else:
        with warnings.catch_warnings():
            # Received zmq frames are read-only memoryviews; the tensor owns a
            # reference to the frame and nobody else writes to it, so aliasing is safe.
            warnings.simplefilter("ignore", UserWarning)
            t = torch.frombuffer(buf, dtype=torch.uint8)
        t = t.view(dtype).reshape(shape)
    if device != "cpu":
        try:
            t = t.to(device)
        except (RuntimeError, AssertionError):
            pass  # device absent here: keep the CPU copy rather than fail the call
    if requires_grad:
        t.requires_grad_(True)
    return t


def _rebuild_exception(cls: type, args: tuple, state: dict) -> BaseException:
    exc = cls.__new__(cls, *args)
    exc.args = args
    exc.__dict__.update(state)
    return exc


def _reduce_exception(exc: BaseException) -> Any:
    """Exceptions by their ``args`` and ``__dict__``, without calling ``__init__`` again.

    Python's default re-calls ``cls(*args)``, which fails for any exception whose
    ``__init__`` takes other parameters than its message (``SchemaError(table, column,
    ...)``): such an error raised in an actor could not reach its caller.
    """
    if type(exc).__reduce__ is not BaseException.__reduce__ or type(exc).__reduce_ex__ is not BaseException.__reduce_ex__:
        return NotImplemented  # the class chose its own way (ActorError does)
    state = {k: v for k, v in getattr(exc, "__dict__", {}).items()}
    return _rebuild_exception, (type(exc), exc.args, state)


def _code_reduce_keep_filename(code: types.CodeType) -> Any:
    """cloudpickle blanks ``co_filename`` of by-value code; keep it so remote tracebacks show source lines."""
    reduce = getattr(cloudpickle.cloudpickle, "_code_reduce", None)
    if reduce is None:
        return NotImplemented
    fn, args = reduce(code)
    return fn, tuple(code.co_filename if a == "<dynamic-code>" else a for a in args)


class _Pickler(cloudpickle.Pickler):
    def reducer_override(self, obj: Any) -> Any:
        if type(obj) is types.CodeType:
            return _code_reduce_keep_filename(obj)
        if isinstance(obj, BaseException):
            return _reduce_exception(obj)
        torch = _torch()
        if torch is not None and type(obj) is torch.Tensor or (
            torch is not None and isinstance(obj, torch.nn.Parameter)
        ):
            return self._reduce_tensor(obj)
        return super().reducer_override(obj)

    @staticmethod
    def _reduce_tensor(t: Any) -> Any:
        import torch  # deferred: torch is heavy; only a tensor in a message loads it

        device = str(t.device)
        data = t.detach()
        if data.device.type != "cpu":
            data = data.cpu()
        if not data.is_contiguous():
            data = data.contiguous()
        if data.is_quantized or data.layout != torch.strided:
            return NotImplemented
        flat = data.reshape(-1).view(torch.uint8) if data.numel() else torch.empty(0, dtype=torch.uint8)
        raw = flat.numpy()
        if raw.nbytes >= OOB_THRESHOLD:
            payload: Any = pickle.PickleBuffer(raw)
        else:
            payload = raw.tobytes()
        return (_rebuild_tensor, (payload, t.dtype, tuple(t.shape), device, bool(t.requires_grad)))


def _name_unpicklable(obj: Any, exc: BaseException) -> str:
    """Find the first nested value that fails to pickle, for an error that names its type."""
    seen: set[int] = set()

    def walk(o: Any, path: str) -> str | None:
        if id(o) in seen:
            return None
        seen.add(id(o))
        children: list[tuple[str, Any]] = []
        if isinstance(o, dict):
            children = [(f"{path}[{k!r}]", v) for k, v in o.items()]
        elif isinstance(o, (list, tuple, set, frozenset)):
            children = [(f"{path}[{i}]", v) for i, v in enumerate(o)]
        for p, child in children:
            found = walk(child, p)
            if found:
                return found
        try:
            cloudpickle.dumps(o, protocol=5)
        except Exception:
            return f"{path} of type {type(o).__module__}.{type(o).__qualname__}"
        return None

    where = walk(obj, "value")
    return f"cannot pickle {where or type(obj).__qualname__}: {exc}"


_SCALARS = frozenset({type(None), bool, int, float, str, bytes})
_CONTAINERS = frozenset({tuple, list, dict})


def _plain(obj: Any, depth: int = 3) -> bool:
    """Scalars, and small tuples/lists/dicts of them: what the C pickler writes exactly as cloudpickle
    does (cloudpickle differs only for functions, classes and modules, and for buffers sent out of band)."""
    t = type(obj)
    if t in _SCALARS:
        return True
    if t not in _CONTAINERS or not depth or len(obj) > 16:
        return False
    # Loops, not all(<generator>), and scalars and empty containers told apart here rather than by a call
    # each: this runs on every call (an endpoint's (args, kwargs), then its result).
    if t is dict:
        for k, v in obj.items():
            if type(k) is not str:
                return False
            tv = type(v)
            if tv in _SCALARS or (tv in _CONTAINERS and not v):
                continue
            if not _plain(v, depth - 1):
                return False
        return True
    for x in obj:
        tx = type(x)
        if tx in _SCALARS or (tx in _CONTAINERS and not x):
            continue
        if not _plain(x, depth - 1):
            return False
    return True


def dumps(obj: Any) -> list[Any]:
    """Serialize ``obj`` into ``[header, *buffers]`` ready for ``send_multipart(copy=False)``."""
    if _plain(obj):  # most control calls: the C pickler alone is ~5x cheaper than a cloudpickle Pickler
        return [pickle.dumps(obj, protocol=5)]
    buffers: list[pickle.PickleBuffer] = []

    def keep(buf: pickle.PickleBuffer) -> bool:
        if memoryview(buf).nbytes < OOB_THRESHOLD:
            return True  # serialize in-band
        buffers.append(buf)
        return False

    f = io.BytesIO()
    try:
        _Pickler(f, protocol=5, buffer_callback=keep).dump(obj)
    except Exception as exc:  # pickling raises many types: name the culprit
        raise SerializationError(_name_unpicklable(obj, exc)) from exc
    return [f.getbuffer(), *(b.raw() for b in buffers)]


def loads(frames: list[Any]) -> Any:
    """Inverse of :func:`dumps`; ``frames`` may be bytes, memoryviews or ``zmq.Frame`` objects."""
    if len(frames) == 1:  # most messages: no list of buffers to build
        head, bufs = getattr(frames[0], "buffer", frames[0]), ()
    else:
        head, *bufs = [getattr(fr, "buffer", fr) for fr in frames]  # type: ignore[assignment]  # a list, where one frame had ()
    try:
        return pickle.loads(head, buffers=bufs)
    except Exception as exc:
        raise SerializationError(f"cannot unpickle message: {type(exc).__name__}: {exc}") from exc


def nbytes(frames: list[Any]) -> int:
    """Total payload size of a frame list (for byte counters and span telemetry)."""
    if len(frames) == 1:  # the usual message: no generator (this runs on every call and reply)
        return memoryview(getattr(frames[0], "buffer", frames[0])).nbytes
    return sum(memoryview(getattr(fr, "buffer", fr)).nbytes for fr in frames)
