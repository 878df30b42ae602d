"""The work scheduler's credit rule: lag 0 is lockstep, lag L lets L batches run ahead, drops free
credit, and credit is held per id so nothing is released twice (a requeued rollout trained again)."""

import asyncio

import pytest

from rlmesh.rl.run.schedule import AsyncWorkScheduler, WorkScheduler


def drain(s: WorkScheduler) -> list:
    out = []
    while (item := s.issue()) is not None:
        out.append(item)
    return out


def ids(items) -> list[str]:
    return [i.work_id for i in items]


def test_on_policy_issues_one_batch_per_version():
    s = WorkScheduler(per_step=2, max_policy_lag=0)
    first = drain(s)
    assert [i.min_version for i in first] == [0, 0] and len(set(ids(first))) == 2
    s.consumed(ids(first), version=1)
    second = drain(s)
    assert [i.min_version for i in second] == [1, 1] and [i.index for i in second] == [2, 3]


def test_lag_one_runs_one_batch_ahead():
    s = WorkScheduler(per_step=3, max_policy_lag=1)
    items = drain(s)
    assert len(items) == 6 and s.capacity == 6
    s.consumed(ids(items[:3]), version=1)
    assert [i.min_version for i in drain(s)] == [1, 1, 1]


def test_rejected_items_free_credit_and_reissue_keeps_the_id():
    s = WorkScheduler(per_step=2, max_policy_lag=0)
    a, b = drain(s)
    s.rejected([a.work_id], ["stale"])
    (c,) = drain(s)
    assert c.work_id not in (a.work_id, b.work_id)
    s.reissue(b, "generator died")      # b's generator died: same id again, no new credit
    again = s.issue()
    assert again.work_id == b.work_id and s.outstanding == 2 and s.reissued == 1
    assert s.issue() is None


def test_releasing_twice_or_unknown_ids_frees_nothing_more():
    s = WorkScheduler(per_step=2, max_policy_lag=0)
    a, b = drain(s)
    s.consumed([a.work_id], version=1)
    s.consumed([a.work_id, "never-issued"], version=2)  # a requeued rollout trained again after a trainer restart
    assert s.outstanding == 1 and s.in_flight() == [b.work_id] and s.version == 2
    assert len(drain(s)) == 1


def test_events_account_for_every_issued_id():
    events: list[tuple[str, str, str]] = []
    s = AsyncWorkScheduler(per_step=2, max_policy_lag=0, prefix="r-", on_event=lambda *e: events.append(e))
    a = asyncio.run(s.next_item())
    b = asyncio.run(s.next_item())
    s.reissue(a, "generator died (signal 9)")
    s.finished({"rollout_id": a.work_id, "accepted": True})
    s.finished({"rollout_id": a.work_id, "accepted": False, "reason": "duplicate"})
    s.finished({"rollout_id": b.work_id, "accepted": False, "reason": "stale"})
    s.consumed([a.work_id], version=1)
    assert events == [("issued", "r-0000000", ""), ("issued", "r-0000001", ""),
                      ("reissued", "r-0000000", "generator died (signal 9)"), ("completed", "r-0000000", ""),
                      ("duplicate", "r-0000000", "the original landed first"), ("dropped", "r-0000001", "stale"),
                      ("consumed", "r-0000000", "")]
    assert s.outstanding == 0 and (s.issued, s.reissued, s.completed, s.dropped) == (2, 1, 1, 1)


@pytest.mark.parametrize("per_step,lag", [(0, 0), (1, -1)])
def test_bad_arguments(per_step, lag):
    with pytest.raises(ValueError):
        WorkScheduler(per_step, lag)


def test_a_dead_buffer_takes_its_delivered_items_with_it():
    events: list[tuple[str, str, str]] = []
    s = WorkScheduler(per_step=2, max_policy_lag=1, on_event=lambda *e: events.append(e))
    a, b, c, d = drain(s)
    for item in (a, b, c):
        s.completed_item(item.work_id)
    s.consumed([a.work_id], version=1)
    # the buffer died holding b and c; c was delivered again to its replacement since; d still running
    assert s.lost_with_buffer("the buffer's proc died with it", kept=[c.work_id]) == [b.work_id]
    assert s.in_flight() == [c.work_id, d.work_id]
    assert events[-1] == ("dropped", b.work_id, "the buffer's proc died with it")
    assert s.lost_with_buffer("again") == [c.work_id] and s.in_flight() == [d.work_id]
