"""Replay-buffer staleness, duplicates, capacity and accounting."""

import pytest

from rlmesh.rl.buffer import BufferedRollout, ReplayBufferCore
from rlmesh.rl.config import BufferConfig


def _r(i, version, n=1):
    return BufferedRollout(f"r{i}", version, data=i, num_samples=n)


def test_strictly_on_policy_drops_every_older_version():
    buf = ReplayBufferCore(BufferConfig(max_policy_lag=0))
    for i, v in enumerate([0, 1, 1, 2, 2]):
        buf.add(_r(i, v))
    out = buf.sample(2, current_version=2)
    assert [r.rollout_id for r in out.rollouts] == ["r3", "r4"]
    assert {d.rollout_id for d in out.dropped} == {"r0", "r1", "r2"}
    assert all(d.reason == "stale" for d in out.dropped)
    assert {d.rollout_id: d.lag for d in out.dropped} == {"r0": 2, "r1": 1, "r2": 1}
    assert out.max_lag == 0 and len(buf) == 0


def test_lag_bound_keeps_rollouts_up_to_the_limit():
    buf = ReplayBufferCore(BufferConfig(max_policy_lag=2))
    for i, v in enumerate([3, 4, 5, 6]):
        buf.add(_r(i, v))
    assert buf.num_ready(current_version=6) == 3
    out = buf.sample(3, current_version=6)
    assert [r.policy_version for r in out.rollouts] == [4, 5, 6]
    assert [(d.rollout_id, d.lag) for d in out.dropped] == [("r0", 3)]
    assert out.max_lag == 2


def test_not_enough_fresh_rollouts_consumes_nothing_unless_partial():
    buf = ReplayBufferCore(BufferConfig(max_policy_lag=1))
    buf.add(_r(0, 5))
    out = buf.sample(2, current_version=5)
    assert out.rollouts == [] and len(buf) == 1
    out = buf.sample(2, current_version=5, partial=True)
    assert [r.rollout_id for r in out.rollouts] == ["r0"] and len(buf) == 0


def test_duplicates_are_dropped_even_after_consumption():
    buf = ReplayBufferCore(BufferConfig())
    assert buf.add(_r(0, 0)) == []
    dup = buf.add(_r(0, 0))
    assert [(d.rollout_id, d.reason) for d in dup] == [("r0", "duplicate")]
    buf.sample(1, current_version=0)
    assert buf.add(_r(0, 0))[0].reason == "duplicate"  # a re-issued rollout never counts twice
    assert len(buf) == 0


def test_capacity_evicts_oldest_and_reports_it():
    buf = ReplayBufferCore(BufferConfig(capacity=2, max_policy_lag=10))
    buf.add(_r(0, 0))
    buf.add(_r(1, 0))
    evicted = buf.add(_r(2, 0))
    assert [(d.rollout_id, d.reason) for d in evicted] == [("r0", "capacity")]
    assert [r.rollout_id for r in buf.sample(2, 0).rollouts] == ["r1", "r2"]


def test_stats_account_for_every_rollout_exactly_once():
    buf = ReplayBufferCore(BufferConfig(capacity=3, max_policy_lag=0))
    for i in range(5):
        buf.add(_r(i, i // 2, n=10))  # versions 0 0 1 1 2; capacity evicts r0 and r1
    buf.add(_r(4, 2))  # duplicate
    buf.sample(1, current_version=2)  # r2, r3 stale; r4 sampled
    s = buf.stats()
    assert s["buffer/added"] == 5 and s["buffer/sampled"] == 1 and s["buffer/sampled_samples"] == 10
    assert (s["buffer/dropped_capacity"], s["buffer/dropped_stale"], s["buffer/dropped_duplicate"]) == (2, 2, 1)
    assert s["buffer/added"] == s["buffer/sampled"] + s["buffer/dropped_capacity"] + s["buffer/dropped_stale"] + s["buffer/size"]


def test_future_versions_are_a_caller_error():
    buf = ReplayBufferCore(BufferConfig())
    buf.add(_r(0, 3))
    with pytest.raises(ValueError, match="ahead of the trainer"):
        buf.sample(1, current_version=2)


def fill(buf: ReplayBufferCore, ids: list[str], version: int = 0) -> None:
    for i in ids:
        buf.add(BufferedRollout(i, version))


def test_a_restarted_trainer_gets_back_what_its_dead_incarnation_sampled():
    buf = ReplayBufferCore(BufferConfig(max_policy_lag=5, capacity=100))
    fill(buf, ["a", "b", "c", "d", "e", "f"])
    one = buf.sample(2, 0, lease=True)            # lease 1: trained, then checkpointed
    assert buf.settle(cursor=one.lease, durable=0) == []
    two = buf.sample(2, 0, lease=True)            # lease 2: trained, not yet checkpointed
    buf.settle(cursor=two.lease, durable=one.lease)
    buf.sample(1, 0, lease=True)                  # lease 3: sampled, the trainer dies mid-step
    # the replacement restores the checkpoint taken after lease 1: leases 2 and 3 come back, oldest first
    back = buf.settle(cursor=one.lease, durable=one.lease)
    assert [r.rollout_id for r in back] == ["c", "d", "e"]
    assert [r.rollout_id for r in buf.sample(4, 0, lease=True).rollouts] == ["c", "d", "e", "f"]
    assert buf.stats()["buffer/requeued"] == 3


def test_requeued_rollouts_are_still_subject_to_the_staleness_bound():
    buf = ReplayBufferCore(BufferConfig(max_policy_lag=1, capacity=100))
    fill(buf, ["a", "b"], version=3)
    buf.sample(2, 3, lease=True)
    buf.settle(cursor=0, durable=0)               # a trainer restarted from an older checkpoint ...
    res = buf.sample(2, 6)                        # ... publishes past the newest version: both are stale now
    assert res.rollouts == [] and {(d.rollout_id, d.reason, d.lag) for d in res.dropped} == {("a", "stale", 3),
                                                                                            ("b", "stale", 3)}


def test_settled_leases_are_forgotten_and_lease_ids_continue_after_a_resumed_cursor():
    buf = ReplayBufferCore(BufferConfig(max_policy_lag=5, capacity=100))
    fill(buf, ["a", "b"])
    buf.settle(cursor=151, durable=151)           # a trainer resumed by a new controller, new buffer
    lease = buf.sample(1, 0, lease=True).lease
    assert lease == 152
    buf.settle(cursor=lease, durable=lease)
    assert buf.stats()["buffer/leased"] == 0 and buf.settle(cursor=lease, durable=lease) == []
    with pytest.raises(ValueError, match="durable lease 3 is after the trained cursor 2"):
        buf.settle(cursor=2, durable=3)


def test_fates_say_where_ids_went_when_the_trainers_answer_was_lost():
    buf = ReplayBufferCore(BufferConfig(max_policy_lag=0, capacity=100))
    fill(buf, ["a", "b"], version=3)
    first = buf.sample(1, 3, lease=True).lease      # "a": trained, checkpointed, then the trainer died
    buf.sample(1, 3, lease=True)                    # "b": sampled after the checkpoint by the dead trainer
    fill(buf, ["c"], version=3)
    assert buf.fates(["a", "b", "c", "z"]) == {"a": "held", "b": "held", "c": "held", "z": "unknown"}
    buf.settle(cursor=first, durable=first)         # the replacement loaded the checkpoint of "a"'s step
    res = buf.sample(1, 4, lease=True)              # ... and published past it: "b" and "c" are stale
    assert res.rollouts == [] and buf.fates(["a", "b", "c"]) == {"a": "trained", "b": "dropped:stale",
                                                                  "c": "dropped:stale"}
