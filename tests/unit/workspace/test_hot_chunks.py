"""Small chunks kept in memory to forward: bounded, oldest dropped first, never a view of reused memory."""

from rlmesh.workspace.serve import HotChunks


def test_keeps_small_chunks_up_to_the_cap_dropping_the_oldest():
    hot = HotChunks(cap=10, max_chunk=4)
    for i in range(4):
        hot.add(f"h{i}", bytes([i]) * 3)
    assert hot.get("h0") is None  # 12 bytes > 10: the oldest went
    assert [hot.get(f"h{i}") for i in (1, 2, 3)] == [b"\x01" * 3, b"\x02" * 3, b"\x03" * 3]
    hot.add("big", b"x" * 5)  # above max_chunk: read from the store instead
    assert hot.get("big") is None


def test_a_view_is_copied_so_a_reused_buffer_cannot_change_it():
    buf = bytearray(b"abcd")
    hot = HotChunks()
    hot.add("h", memoryview(buf))
    buf[:] = b"zzzz"  # a one-sided read's staging buffer, reused for the next batch
    assert hot.get("h") == b"abcd"
