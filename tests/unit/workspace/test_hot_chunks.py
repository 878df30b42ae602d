"""Chunks kept in memory to forward: bounded, oldest dropped first, never a view of reused memory."""

from rlmesh.workspace.serve import HotChunks, store_lookup
from rlmesh.workspace.store import ChunkStore, chunk_hash


def test_keeps_chunks_up_to_the_cap_dropping_the_oldest():
    hot = HotChunks(cap=10, max_chunk=4)
    for i in range(4):
        hot.add(f"h{i}", bytes([i]) * 3)
    assert hot.get("h0") is None  # 12 bytes > 10: the oldest went
    assert [hot.get(f"h{i}") for i in (1, 2, 3)] == [b"\x01" * 3, b"\x02" * 3, b"\x03" * 3]
    hot.add("big", memoryview(bytearray(b"x" * 5)))  # reused memory above max_chunk: read from the store instead
    assert hot.get("big") is None
    frame = memoryview(b"y" * 6)  # a received frame of its own, above max_chunk: kept as it is, no copy
    hot.add("own", frame, owned=True)
    assert hot.get("own") is frame


def test_a_view_is_copied_so_a_reused_buffer_cannot_change_it():
    buf = bytearray(b"abcd")
    hot = HotChunks()
    hot.add("h", memoryview(buf))
    buf[:] = b"zzzz"  # a one-sided read's staging buffer, reused for the next batch
    assert hot.get("h") == b"abcd"


def test_a_chunk_still_coming_is_not_looked_for_and_one_held_is(tmp_path):
    store = ChunkStore(str(tmp_path / "store"))
    held, later = b"held", b"later"
    store.put(chunk_hash(held), held)
    coming = {chunk_hash(later)}
    lookup = store_lookup(store, coming=coming)
    assert lookup(chunk_hash(held)) == held
    store.put(chunk_hash(later), later)  # on disk, but still in `coming`: the receiver has not announced it
    assert lookup(chunk_hash(later)) is None
    coming.clear()
    assert lookup(chunk_hash(later)) == later
