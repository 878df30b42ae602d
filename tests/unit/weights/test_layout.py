"""Layout, manifest and chunk planning: pure logic every transport relies on."""

import numpy as np
import pytest
import torch

from rlmesh.weights.errors import StateDictMismatchError
from rlmesh.weights.layout import ALIGN, Manifest, check_target, plan_chunks, plan_layout, with_checksums


def _sd():
    return {
        "w": torch.zeros(3, 5),  # 60 bytes: next entry must skip to 64
        "b16": torch.zeros(7, dtype=torch.bfloat16),
        "scalar": torch.tensor(3, dtype=torch.int64),
        "empty": torch.zeros(0, 4),
        "np": np.zeros((2, 3), dtype=np.float16),
        "flag": torch.zeros(3, dtype=torch.bool),
    }


def test_entries_are_aligned_sized_and_typed():
    m = plan_layout("p", 1, _sd())
    by = {e.key: e for e in m.entries}
    assert [e.key for e in m.entries] == list(_sd())
    assert all(e.offset % ALIGN == 0 for e in m.entries)
    assert by["w"].nbytes == 60 and by["b16"].offset == 64
    assert by["b16"].dtype == "bfloat16" and by["b16"].nbytes == 14
    assert by["scalar"].shape == () and by["scalar"].nbytes == 8
    assert by["empty"].nbytes == 0 and by["empty"].shape == (0, 4)
    assert by["np"].kind == "numpy" and by["np"].dtype == "<f2" and by["np"].nbytes == 12
    offs = [(e.offset, e.offset + e.nbytes) for e in m.entries if e.nbytes]
    assert all(a_end <= b_start for (_, a_end), (b_start, _) in zip(offs, offs[1:]))


def test_manifest_roundtrips_through_json_bytes():
    m = with_checksums(plan_layout("p", 1, _sd()), range(6), 7, {"cuda_device": 0})
    back = Manifest.from_bytes(m.to_bytes())
    assert back == m and back.version == 7 and back.entries[3].checksum == 3


def test_manifest_rejects_unknown_format():
    with pytest.raises(ValueError, match="format"):
        Manifest.from_bytes(b'{"format": 99}')


@pytest.mark.parametrize("bad", [{"x": [1, 2]}, {"x": np.array([object()])}, {}, {3: torch.zeros(1)}])
def test_plan_rejects_non_tensor_values_naming_the_key(bad):
    with pytest.raises(TypeError) as ei:
        plan_layout("p", 1, bad)
    if bad and isinstance(next(iter(bad)), str):
        assert "'x'" in str(ei.value)


@pytest.mark.parametrize("chunk", [64, 128, 4096, 1 << 20])
def test_chunks_cover_every_byte_once_and_keep_pieces_8_aligned(chunk):
    sd = {f"t{i}": torch.zeros(n, dtype=torch.uint8) for i, n in enumerate([1, 63, 64, 65, 5000, 0, 3, 200_000])}
    m = plan_layout("p", 1, sd)
    chunks, pieces = plan_chunks(m, chunk)
    assert all(0 < n <= chunk for _, n in chunks)
    assert all(a + n <= b for (a, n), (b, _) in zip(chunks, chunks[1:]))
    for e, ps in zip(m.entries, pieces):
        assert sum(p.length for p in ps) == e.nbytes
        pos = e.offset
        for p in ps:
            start, length = chunks[p.chunk]
            assert start + p.start == pos and p.start + p.length <= length
            assert (pos - e.offset) % 8 == 0  # checksum additivity needs this
            pos += p.length


def test_small_entries_share_one_chunk():
    sd = {f"t{i}": torch.zeros(10) for i in range(20)}
    chunks, pieces = plan_chunks(plan_layout("p", 1, sd), 1 << 20)
    assert len(chunks) == 1 and all(ps[0].chunk == 0 for ps in pieces)


def test_chunk_size_must_be_aligned():
    with pytest.raises(ValueError, match="multiple of 64"):
        plan_chunks(plan_layout("p", 1, {"a": torch.zeros(1)}), 100)


def test_check_target_names_first_bad_key():
    m = plan_layout("p", 1, {"a": torch.zeros(2), "b": torch.zeros(3), "c": torch.zeros(4)})
    with pytest.raises(StateDictMismatchError) as ei:
        check_target(m, {"a": torch.zeros(2), "b": torch.zeros(4), "c": torch.zeros(5)})
    assert ei.value.key == "b" and "(3,)" in str(ei.value) and "(4,)" in str(ei.value)
    with pytest.raises(StateDictMismatchError) as ei:
        check_target(m, {"a": torch.zeros(2), "zz": torch.zeros(1), "b": torch.zeros(3), "c": torch.zeros(4)})
    assert ei.value.key == "zz" and "not in published" in str(ei.value)
    with pytest.raises(StateDictMismatchError) as ei:
        check_target(m, {"a": torch.zeros(2), "c": torch.zeros(4)})
    assert ei.value.key == "b" and "missing from the target" in str(ei.value)
    with pytest.raises(StateDictMismatchError) as ei:
        check_target(m, {"a": torch.zeros(2), "b": torch.zeros(3), "c": torch.zeros(4)}, dtype=torch.bfloat16)
    assert ei.value.key == "a"
    check_target(m, {"c": torch.zeros(4), "a": torch.zeros(2), "b": torch.zeros(3)})  # order does not matter
