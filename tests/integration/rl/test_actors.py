"""The RL actors on real procs: re-issued work is caught as a duplicate, staleness drops are reported,
and a trainer checkpoint restores model, optimiser, RNG, step and version exactly."""

import time
import uuid

import pytest
import torch

import rlmesh as rm
from rlmesh.rl.actors import GymGenerator, PPOTrainer, ReplayBuffer
from rlmesh.rl.config import BufferConfig, GymGeneratorConfig, PPOConfig
from rlmesh.rl.models.mlp import ActorCritic
from rlmesh.rl.rollout import RolloutCollector
from rlmesh.rl.run.schedule import WorkItem

GEN = GymGeneratorConfig(num_envs=2, num_steps=8)
PPO = PPOConfig(total_steps=10_000, num_minibatches=2, update_epochs=2)


@pytest.mark.timeout(120)
def test_reissued_work_is_a_duplicate_and_stale_rollouts_are_dropped():
    name = f"policy-{uuid.uuid4().hex[:6]}"
    with rm.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        buffer = procs.slice(procs=0).spawn("buffer_dup", ReplayBuffer, BufferConfig(max_policy_lag=0))
        trainer = procs.slice(procs=0).spawn("trainer_dup", PPOTrainer, PPO, "CartPole-v1", buffer, weights=name)
        gen = procs.slice(procs=1).spawn("gen_dup", GymGenerator, GEN, buffer, weights=name)
        item = WorkItem("rollout-a", 0, 0)
        first = gen.collect.call_one(item).get()
        again = gen.collect.call_one(item).get()           # the same work, re-issued after a (pretend) death
        assert first["accepted"] and first["policy_version"] == 0
        assert not again["accepted"] and again["reason"] == "duplicate"
        m = trainer.train.call_one(1, 10.0).get()
        assert m.trained and m.step == 1 and m.policy_version == 1 and m.rollout_ids == ["rollout-a"]
        # a rollout from version 0 arriving after version 1 is stale for an on-policy buffer
        gen_old = procs.slice(procs=1).spawn("gen_old", GymGenerator, GEN, buffer, weights=name)
        assert gen.collect.call_one(WorkItem("rollout-b", 1, 1)).get()["policy_version"] == 1
        stats = buffer.stats.call_one().get()
        assert stats["buffer/dropped_duplicate"] == 1 and stats["buffer/added"] == 2
        m = trainer.train.call_one(1, 10.0).get()
        assert m.rollout_ids == ["rollout-b"] and m.policy_version == 2
        late = gen_old.collect.call_one(WorkItem("rollout-c", 1, 2)).get()   # pulls v2, trainer now at v2: fresh
        assert late["accepted"] and late["policy_version"] == 2
        empty = trainer.train.call_one(2, 0.5).get()        # only one rollout there: nothing trained
        assert not empty.trained and empty.step == 2


def test_checkpoint_restores_everything(tmp_path):
    cfg = PPOConfig(total_steps=10_000, num_minibatches=2, update_epochs=2, checkpoint_dir=str(tmp_path),
                    checkpoint_every=0)  # saved by hand below
    trainer = PPOTrainer(cfg, "CartPole-v1", weights=f"ckpt-{uuid.uuid4().hex[:6]}", seed=3)
    collector = RolloutCollector(GEN, ActorCritic(*__import__("rlmesh.rl.actors.gym_generator", fromlist=["x"])
                                                  .env_spaces("CartPole-v1")), seed=1)
    r1, r2 = collector.collect(0), collector.collect(0)
    trainer.learn([r1])
    path = trainer.save_checkpoint()
    assert path.name == "step_00000001.pt"
    after = trainer.learn([r2])
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    torch.manual_seed(999)                                  # disturb every RNG the step uses
    assert trainer.load_checkpoint(path) and trainer.step == 1 and trainer.version == 3   # versions never repeat
    redo = trainer.learn([r2])                              # same batch, restored state: same result, bit for bit
    assert redo.metrics == after.metrics and redo.step == 2 and redo.policy_version == 4
    assert all(torch.equal(v, weights[k]) for k, v in trainer.model.state_dict().items())
    fresh = PPOTrainer(cfg, "CartPole-v1", weights=f"ckpt-{uuid.uuid4().hex[:6]}", seed=0)
    assert fresh.step == 1                                  # a new trainer resumes from the newest checkpoint
    trainer.publisher.close()
    fresh.publisher.close()
    collector.close()


class _Evil:
    """Unpickling this runs a shell command: what a planted checkpoint would do."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        import os

        return (os.system, (f"touch {self.marker}",))


def test_planted_and_corrupt_checkpoints_are_refused(tmp_path):
    """Issue 11 item 4: checkpoints were loaded with weights_only=False, so a planted file ran code."""
    import hashlib
    import json
    import stat

    from rlmesh.rl import checkpoint

    d, marker = tmp_path / "ckpt", tmp_path / "pwned"
    cfg = PPOConfig(total_steps=10_000, num_minibatches=2, checkpoint_dir=str(d), checkpoint_every=0)
    trainer = PPOTrainer(cfg, "CartPole-v1", weights=f"ckpt-{uuid.uuid4().hex[:6]}", seed=3)
    good = trainer.save_checkpoint()
    assert stat.S_IMODE(d.stat().st_mode) == 0o700 and stat.S_IMODE(good.stat().st_mode) == 0o600
    assert stat.S_IMODE(checkpoint.meta_path(good).stat().st_mode) == 0o600
    # planted without a side file: not a checkpoint (resume takes the good one), and refused by name
    planted = d / "step_99999999.pt"
    torch.save({"model": _Evil(marker)}, planted)
    assert trainer.newest_checkpoint() == good
    with pytest.raises(checkpoint.CheckpointError, match="no step_99999999.json"):
        trainer.load_checkpoint(planted)
    # planted with a matching side file (the attacker can hash too): refused by weights_only, no code ran
    data = planted.read_bytes()
    checkpoint.meta_path(planted).write_text(json.dumps(
        {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data), "step": 99999999, "version": 0, "format": 1}))
    with pytest.raises(checkpoint.CheckpointError, match="more than tensors"):
        trainer.load_checkpoint()
    assert not marker.exists()
    planted.unlink()
    checkpoint.meta_path(planted).unlink()
    # corrupted (one flipped byte): refused with a clear error naming the file
    raw = bytearray(good.read_bytes())
    raw[len(raw) // 2] ^= 0xFF
    good.write_bytes(bytes(raw))
    with pytest.raises(checkpoint.CheckpointError, match="fails its checksum"):
        PPOTrainer(cfg, "CartPole-v1", weights=f"ckpt-{uuid.uuid4().hex[:6]}", seed=0)
    trainer.publisher.close()


@pytest.mark.timeout(120)
def test_a_sample_that_drops_stale_rollouts_returns_at_once_with_the_drops():
    """The controller holds generation credit for each rollout until it hears its end: a sample that
    waited out its whole timeout after dropping the only rollouts there (a restarted trainer a
    version ahead of all of them) stalled the run for that timeout, with nothing new issued."""
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        buffer = procs.spawn("buffer_stale", ReplayBuffer, BufferConfig(max_policy_lag=1))
        for i in range(2):
            assert buffer.add.call_one(f"old-{i}", 3, {"x": i}, 1).get() == ""
        t0 = time.monotonic()
        res = buffer.sample.call_one(2, 6, 60.0).get()       # version 6: both are 3 versions behind
        assert time.monotonic() - t0 < 30, "the sample waited for its timeout instead of reporting its drops"
        assert res.rollouts == [] and sorted(d.rollout_id for d in res.dropped) == ["old-0", "old-1"]
        assert {d.reason for d in res.dropped} == {"stale"}


@pytest.mark.timeout(120)
def test_an_interrupt_also_ends_samples_that_start_after_it():
    """A failed run interrupts the buffer, then asks the trainer for a final checkpoint. On a busy host
    the trainer may be between two samples when the interrupt lands: its next sample must not wait
    out its timeout (60 s, with the final save queued behind it on the trainer's thread)."""
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        buffer = procs.spawn("buffer_interrupted", ReplayBuffer, BufferConfig(max_policy_lag=1))
        waiting = buffer.sample.call_one(2, 0, 60.0)  # waiting when the interrupt lands
        buffer.interrupt.call_one().get(timeout=10)
        t0 = time.monotonic()
        assert waiting.get(timeout=30).rollouts == []
        later = buffer.sample.call_one(2, 0, 60.0).get(timeout=30)  # asked after it
        assert later.rollouts == [] and time.monotonic() - t0 < 20


@pytest.mark.timeout(120)
def test_generator_killed_mid_rollout_is_reissued_and_counted_once():
    import os
    import signal
    import time

    name = f"policy-{uuid.uuid4().hex[:6]}"
    slow = GymGeneratorConfig(num_envs=2, num_steps=12_000)     # a few seconds per rollout
    with rm.this_host().spawn_procs(per_host={"procs": 2}, restart=rm.Restart(max_restarts=1)) as procs:
        buffer = procs.slice(procs=0).spawn("buffer_kill", ReplayBuffer, BufferConfig(max_policy_lag=0))
        procs.slice(procs=0).spawn("trainer_kill", PPOTrainer, PPO, "CartPole-v1", buffer, weights=name)
        gen = procs.slice(procs=1).spawn("gen_kill", GymGenerator, slow, buffer, weights=name)
        item = WorkItem("rollout-k", 0, 0)
        pending = gen.collect.call_one(item)
        time.sleep(1.0)
        os.kill(procs.pids[1], signal.SIGKILL)
        with pytest.raises(rm.ActorDied):
            pending.get()
        procs.wait_alive(timeout=60)
        again = gen.collect.call_one(item).get()                 # what the recipe does: same id, next replica
        assert again["accepted"] and again["rollout_id"] == "rollout-k"
        stats = buffer.stats.call_one().get()
        assert stats["buffer/added"] == 1 and stats["buffer/dropped_duplicate"] == 0
