"""The TCP reader's window (rlmesh/weights/tcp.py): the read requests in flight never ask for more
than RLMESH_WEIGHTS_TCP_WINDOW_MIB together, with chunks the layout can cut."""

import pytest

from rlmesh.weights.layout import ALIGN
from rlmesh.weights.tcp import CHUNK_BYTES, REQUESTS, window_plan

MiB = 1 << 20


@pytest.mark.parametrize("window_mib", [1, 3, 4, 8, 16, 31, 32, 64, 100, 512])
def test_requests_in_flight_fit_the_window(window_mib):
    chunk, group = window_plan(window_mib * MiB)
    assert REQUESTS * group * chunk <= window_mib * MiB
    assert chunk % ALIGN == 0 and 0 < chunk <= CHUNK_BYTES and group >= 1
    assert group >= 2  # a request holds two chunks at least: one is checksummed while the next arrives


def test_the_default_keeps_full_chunks():
    assert window_plan(64 * MiB) == (CHUNK_BYTES, 4)
    assert window_plan(4 * MiB) == (MiB, 2)
