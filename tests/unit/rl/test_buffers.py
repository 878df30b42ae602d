"""The KV-cache buffer pool hands a buffer out again only when nothing can still read or write it."""

import torch

from rlmesh.rl.models.buffers import BufferPool
from rlmesh.rl.models.transformer import KVCache, TransformerConfig

SHAPE = (4, 2, 16, 8)


def test_a_buffer_is_reused_once_released_and_never_while_held():
    pool = BufferPool()
    a = pool.empty(SHAPE, torch.float32)
    b = pool.empty(SHAPE, torch.float32)
    assert a.data_ptr() != b.data_ptr()  # a is held: b is another buffer
    ptr = a.data_ptr()
    del a
    c = pool.empty(SHAPE, torch.float32)
    assert c.data_ptr() == ptr and pool.reused == 1
    assert pool.empty((4, 2, 16, 4), torch.float32).data_ptr() not in (ptr, b.data_ptr())  # other shape


def test_a_live_view_or_a_list_holding_the_buffer_keeps_it_in_use():
    pool = BufferPool()
    a = pool.empty(SHAPE, torch.float32)
    ptr = a.data_ptr()
    view = a[:, :, 2:5]
    holder = [a]
    del a
    assert pool.empty(SHAPE, torch.float32).data_ptr() != ptr  # the list still holds it
    holder.clear()
    assert pool.empty(SHAPE, torch.float32).data_ptr() != ptr  # the view still reads it
    del view
    assert pool.empty(SHAPE, torch.float32).data_ptr() == ptr


def test_free_buffers_beyond_the_cap_are_let_go():
    pool = BufferPool(max_free_bytes=torch.empty(SHAPE).nbytes)  # room for one free buffer
    held = [pool.empty(SHAPE, torch.float32) for _ in range(3)]
    held.clear()
    pool.empty((1,), torch.float32)  # a sweep: one free buffer kept, the others dropped
    assert len(pool._tensors) == 2


def test_kv_caches_draw_from_the_pool_and_round_their_columns_up():
    cfg = TransformerConfig(vocab_size=8, max_seq_len=200, d_model=16, n_layers=2, n_heads=2)
    first = KVCache(cfg, 3, 70, torch.float32)
    assert first.keys[0].shape == (3, 2, 128, 8) and first.max_len == 70
    ptrs = {t.data_ptr() for t in (*first.keys, *first.values)}
    del first
    second = KVCache(cfg, 3, 100, torch.float32)  # another length, the same rounded shape
    assert {t.data_ptr() for t in (*second.keys, *second.values)} == ptrs
    assert KVCache(cfg, 3, 199, torch.float32).keys[0].shape[2] == 200  # 256 would pass max_seq_len


def test_a_tracer_that_keeps_frame_locals_does_not_stop_reuse():
    """A tracer reading f_locals (pdb, coverage, a debugger) holds extra references to the pool's own
    tensors while it checks them: the check reads the storage's count only, so reuse goes on."""
    import sys

    def tracer(frame, event, arg):
        frame.f_locals  # noqa: B018 -- snapshots locals into the frame, as pdb does
        return tracer

    pool = BufferPool()
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        a = pool.empty(SHAPE, torch.float32)
        ptr = a.data_ptr()
        del a
        again = pool.empty(SHAPE, torch.float32)
    finally:
        sys.settrace(previous)
    assert again.data_ptr() == ptr and pool.reused == 1
