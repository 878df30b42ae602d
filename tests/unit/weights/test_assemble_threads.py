"""Verify and copy of a many-tensor version run on both checksum threads (``assemble.PARALLEL_ENTRIES``):
the result is the serial one, and the first corrupt entry is still the one named."""

import pytest
import torch

from rlmesh.weights import assemble, checksum
from rlmesh.weights.errors import WeightSyncError
from rlmesh.weights.layout import plan_layout, with_checksums


def _version(n: int, floats: int, big: int = 0):
    """``n`` small tensors of ``floats`` fp32 values (and one ``big``-float tensor in the middle), as a
    manifest plus one uint8 piece per entry, as the shm reader hands them over."""
    torch.manual_seed(0)
    sd = {f"w{i}": torch.randn(floats) for i in range(n)}
    if big:
        sd = {**dict(list(sd.items())[: n // 2]), "big": torch.randn(big), **dict(list(sd.items())[n // 2 :])}
    plan = plan_layout("t", 1, sd)
    sources = [[sd[e.key].reshape(-1).view(torch.uint8).clone()] for e in plan.entries]
    sums = [checksum.combine([checksum.sum64(p) for p in pieces]) for pieces in sources]
    return sd, with_checksums(plan, sums, 1), sources


def test_a_version_of_many_small_tensors_checks_and_copies_on_both_threads_as_it_would_serially():
    sd, m, sources = _version(64, 128 * 1024, big=(40 << 20) // 4)   # 64 x 0.5 MiB + one 40 MiB entry
    assert sum(e.nbytes for e in m.entries if e.key != "big") >= assemble.PARALLEL_ENTRIES
    assert len(assemble._small_cpu_entries(sources, checksum.PARALLEL_MIN)) == 64  # the big one splits itself
    assemble.verify(m, sources)
    target = {k: torch.zeros_like(v) for k, v in sd.items()}
    assemble.copy_into(m, sources, target)
    assert all(torch.equal(target[k], v) for k, v in sd.items())


def test_the_first_corrupt_entry_among_many_is_the_one_named():
    _, m, sources = _version(64, 128 * 1024)
    sources[41][0][7] ^= 0xFF                                           # w41 and w50: both on the second half's thread
    sources[50][0][0] ^= 0x01
    with pytest.raises(WeightSyncError, match="checksum mismatch on 'w41'"):
        assemble.verify(m, sources)


def test_halves_cut_at_half_the_bytes_and_small_versions_stay_on_one_thread():
    assert assemble._halves([0, 1, 2, 3], [1, 1, 1, 1]) == [[0, 1], [2, 3]]
    assert assemble._halves([0, 1, 2], [10, 1, 1]) == [[0], [1, 2]]
    _, _, sources = _version(8, 1024)                                   # 32 KiB in all: not worth a thread hop
    assert assemble._small_cpu_entries(sources, checksum.PARALLEL_MIN) == []
