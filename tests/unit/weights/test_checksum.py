"""The per-tensor checksum: additive over 8-aligned pieces, sensitive to any changed byte."""

import numpy as np
import pytest

from rlmesh.weights import checksum


def _bytes(n, seed=0):
    return np.random.default_rng(seed).integers(0, 256, n, dtype=np.uint8)


@pytest.mark.parametrize("n", [0, 1, 7, 8, 9, 1000, 4099])
def test_additive_over_8_aligned_pieces(n):
    a = _bytes(n)
    cuts = sorted({c for c in (8, 64, 1024, 4096) if c < n})
    bounds = [0, *cuts, n]
    parts = [checksum.sum64(a[s:e]) for s, e in zip(bounds, bounds[1:])]
    assert checksum.combine(parts) == checksum.sum64(a)


def test_known_values():
    assert checksum.sum64(b"") == 0
    assert checksum.sum64(bytes([1])) == 1
    assert checksum.sum64((2**64 - 1).to_bytes(8, "little") + (2).to_bytes(8, "little")) == 1  # wraps mod 2**64


@pytest.mark.parametrize("pos", [0, 5, 4095, 8191])
def test_any_flipped_bit_changes_the_sum(pos):
    a = _bytes(8192)
    before = checksum.sum64(a)
    a[pos] ^= 0x10
    assert checksum.sum64(a) != before


def test_parallel_path_equals_serial(monkeypatch):
    a = _bytes(3 << 20, seed=3)
    serial = checksum.sum64(a)
    monkeypatch.setattr(checksum, "PARALLEL_MIN", 1 << 20)
    assert checksum.sum64(a) == serial
    assert checksum.sum64(a[: (3 << 20) - 5]) == checksum.combine(
        [checksum.sum64(a[: 1 << 20]), checksum.sum64(a[1 << 20 : (3 << 20) - 5])])


def test_accepts_torch_memoryview_and_bytes():
    import torch

    a = _bytes(100)
    assert checksum.sum64(torch.from_numpy(a)) == checksum.sum64(memoryview(a.tobytes())) == checksum.sum64(a.tobytes())
