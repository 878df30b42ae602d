"""The actor server's call-id window: a call id is run at most once per caller."""

from rlmesh.actor.dedup import CallIdWindow, Verdict


def test_duplicates_are_refused_out_of_order_ids_are_fine():
    w = CallIdWindow(window=8)
    assert [w.admit("a", i) for i in (1, 3, 2)] == [Verdict.NEW] * 3
    assert w.admit("a", 2) is Verdict.DUPLICATE and w.admit("a", 3) is Verdict.DUPLICATE
    assert w.admit("b", 2) is Verdict.NEW  # callers are apart


def test_memory_is_bounded_and_ids_below_the_window_are_refused():
    w = CallIdWindow(window=8)
    for i in range(1, 1000):
        assert w.admit("a", i) is Verdict.NEW
    assert len(w._callers["a"][1]) <= 16
    assert w.admit("a", 999) is Verdict.DUPLICATE
    assert w.admit("a", 995) is Verdict.DUPLICATE
    assert w.admit("a", 5) is Verdict.TOO_OLD
