import threading

import numpy as np
import pytest
import torch

from rlmesh.transport import AuthError, Authenticator, SerializationError, dumps, is_loopback_address, loads
from rlmesh.transport.serialization import OOB_THRESHOLD


def roundtrip(obj):
    return loads([bytes(f) for f in dumps(obj)])


def test_tensors_of_any_dtype_and_layout_roundtrip():
    t = torch.randn(64, 33).t()  # non-contiguous
    bf = torch.randn(5000).to(torch.bfloat16)
    i8 = torch.randint(-5, 5, (7, 3), dtype=torch.int8)
    empty = torch.empty(0, 4)
    out = roundtrip({"t": t, "bf": bf, "i8": i8, "e": empty, "p": torch.nn.Parameter(torch.ones(3))})
    assert torch.equal(out["t"], t) and out["t"].shape == (33, 64)
    assert out["bf"].dtype == torch.bfloat16 and torch.equal(out["bf"], bf)
    assert torch.equal(out["i8"], i8)
    assert out["e"].shape == (0, 4)
    assert out["p"].requires_grad


def test_large_buffers_travel_out_of_band():
    big = torch.arange(1 << 20, dtype=torch.float32)
    arr = np.arange(1 << 16, dtype=np.int64)
    frames = dumps({"a": big, "b": arr, "small": np.arange(3)})
    assert len(frames) == 3  # header + two large buffers; the small array is inline
    assert memoryview(frames[1]).nbytes == big.numel() * 4
    assert memoryview(frames[0]).nbytes < OOB_THRESHOLD
    out = loads(frames)
    assert torch.equal(out["a"], big) and (out["b"] == arr).all()


def test_unpicklable_value_is_named():
    with pytest.raises(SerializationError, match=r"value\['x'\]\[1\] of type _thread.lock"):
        dumps({"x": [1, threading.Lock()]})


def test_garbage_does_not_unpickle_quietly():
    with pytest.raises(SerializationError, match="cannot unpickle"):
        loads([b"not a pickle"])


def test_empty_secret_refused():
    with pytest.raises(AuthError):
        Authenticator(b"")


@pytest.mark.parametrize("addr,expected", [
    ("tcp://127.0.0.1:5", True), ("tcp://127.3.2.1:5", True), ("tcp://[::1]:5", True),
    ("tcp://localhost:5", True), ("ipc:///tmp/x", True), ("tcp://10.1.2.3:5", False),
    ("tcp://0.0.0.0:5", False), ("tcp://127.0.0.1:5#m" + "ab" * 16, True), ("tcp://10.1.2.3:5#c" + "ab" * 16, False),
])
def test_is_loopback(addr, expected):
    assert is_loopback_address(addr) is expected
