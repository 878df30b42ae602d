"""The work scheduler's credit rule: lag 0 is lockstep, lag L lets L batches run ahead, drops free credit."""

import pytest

from rlmesh.rl.schedule import WorkScheduler


def drain(s: WorkScheduler) -> list:
    out = []
    while (item := s.issue()) is not None:
        out.append(item)
    return out


def test_on_policy_issues_one_batch_per_version():
    s = WorkScheduler(per_step=2, max_policy_lag=0)
    first = drain(s)
    assert [i.min_version for i in first] == [0, 0] and len({i.work_id for i in first}) == 2
    s.consumed(2, version=1)
    second = drain(s)
    assert [i.min_version for i in second] == [1, 1] and [i.index for i in second] == [2, 3]


def test_lag_one_runs_one_batch_ahead():
    s = WorkScheduler(per_step=3, max_policy_lag=1)
    assert len(drain(s)) == 6 and s.capacity == 6
    s.consumed(3, version=1)
    assert [i.min_version for i in drain(s)] == [1, 1, 1]


def test_rejected_items_free_credit_and_reissue_keeps_the_id():
    s = WorkScheduler(per_step=2, max_policy_lag=0)
    a, b = drain(s)
    s.rejected(1)                       # a stale drop
    (c,) = drain(s)
    assert c.work_id not in (a.work_id, b.work_id)
    s.reissue(b)                        # b's generator died: same id again, no new credit
    again = s.issue()
    assert again.work_id == b.work_id and s.outstanding == 2 and s.reissued == 1
    assert s.issue() is None


def test_release_more_than_outstanding_is_an_error():
    s = WorkScheduler(per_step=1, max_policy_lag=0)
    s.issue()
    with pytest.raises(ValueError, match="cannot release 2"):
        s.consumed(2, version=1)


@pytest.mark.parametrize("per_step,lag", [(0, 0), (1, -1)])
def test_bad_arguments(per_step, lag):
    with pytest.raises(ValueError):
        WorkScheduler(per_step, lag)
