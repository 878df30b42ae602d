"""Populating a fresh weight slot's pages ahead of its first write (``SlotFile.populate``)."""

from __future__ import annotations

import os
import secrets
import threading
from typing import Iterator

import numpy as np
import pytest

from rlmesh.weights import slots
from rlmesh.weights.slots import PAGE, SlotFile, chunk_ranges

MIB = 1 << 20


def test_chunk_ranges_cover_the_range_in_order_with_a_short_last_step():
    assert chunk_ranges(0, 10, 4) == [(0, 4), (4, 4), (8, 2)]
    assert chunk_ranges(8, 16, 4) == [(8, 4), (12, 4)]
    assert chunk_ranges(5, 5, 4) == []
    with pytest.raises(ValueError, match="chunk must be > 0"):
        chunk_ranges(0, 10, 0)


@pytest.fixture
def slot() -> Iterator[SlotFile]:
    d = slots.default_shm_dir()
    if not os.path.isdir(d):
        pytest.skip(f"needs the shm dir {d}")
    s = SlotFile(os.path.join(d, f"rlmesh-w-unittest-{os.getpid()}-{secrets.token_hex(4)}-s0"), 0, 4 * MIB, 4096)
    yield s
    s.close(unlink=True)


def _allocated(s: SlotFile) -> int:
    return os.stat(s.path).st_blocks * 512


class _StopAfter:
    """A stop signal that turns on after ``n`` checks: the populator looks once per step."""

    def __init__(self, n: int):
        self.n = n

    def is_set(self) -> bool:
        self.n -= 1
        return self.n < 0


@pytest.mark.parametrize("madvise", [True, False], ids=["madvise", "touch"])
def test_populate_allocates_every_page_and_keeps_what_was_written(slot, monkeypatch, madvise):
    if not madvise:
        monkeypatch.setattr(slots._madvise, "ok", False)  # an older kernel: one byte a page, rewritten
    data = np.arange(MIB, dtype=np.uint8) | 1
    slot.write_fresh(0, data)
    assert _allocated(slot) < 2 * MIB
    assert slot.populate(threading.Event(), chunk=MIB) is True
    assert slot.populated == 4 * MIB and _allocated(slot) >= 4 * MIB
    view = np.frombuffer(slot.mm, np.uint8, 4 * MIB, slot.data_off)
    assert np.array_equal(view[:MIB], data) and not view[MIB:].any()
    del view
    slot.written()
    assert not slot.fresh


def test_a_stopped_populator_leaves_the_rest_for_the_first_write(slot):
    stop = threading.Event()
    stop.set()
    assert slot.populate(stop, chunk=MIB) is False and slot.populated == 0
    assert slot.populate(_StopAfter(2), chunk=MIB) is False  # type: ignore[arg-type]
    assert slot.populated == 2 * MIB and _allocated(slot) < 3 * MIB
    assert slot.populate(threading.Event(), chunk=MIB) is True  # resumes where it stopped
    assert slot.populated == 4 * MIB


def test_populate_on_a_written_slot_does_nothing(slot):
    slot.write_fresh(0, np.ones(PAGE, np.uint8))
    slot.written()
    assert slot.populate(threading.Event()) is True and slot.populated == 0
