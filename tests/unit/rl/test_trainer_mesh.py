"""The trainer mesh's pure parts: how a batch is split over ranks, how per-rank losses are weighed,
how metrics merge, the config's checks and the checkpoint layout (no processes)."""

from __future__ import annotations

import json
import random

import pytest
import torch

from rlmesh.errors import ConfigError
from rlmesh.rl.algorithms.grpo import grpo_advantages, grpo_loss
from rlmesh.rl.backends.base import Completion
from rlmesh.rl.checkpoint import CheckpointError, write
from rlmesh.rl.config import GRPOConfig, PPOConfig
from rlmesh.rl.train import layout
from rlmesh.rl.train.sharding import RankWeightedLoss, grpo_units, merge_metrics, rank_weight, split_groups


def advantages(rewards: torch.Tensor, group_size: int) -> torch.Tensor:
    return grpo_advantages(rewards, group_size)


def items(rewards_per_group: list[list[float]], per_item: int = 3) -> list[dict]:
    """Work items of ``per_item`` groups each; completion ``k`` of group ``g`` has ``g % 3 + 1`` tokens."""
    out, group_size = [], len(rewards_per_group[0])
    for start in range(0, len(rewards_per_group), per_item):
        comps, rewards = [], []
        for g in range(start, min(start + per_item, len(rewards_per_group))):
            comps += [Completion([1, g], [5] * (g % 3 + 1), [0.0] * (g % 3 + 1), text=f"g{g}") for _ in range(group_size)]
            rewards += rewards_per_group[g]
        out.append({"completions": comps, "rewards": rewards, "group_size": group_size, "logprobs_exact": True})
    return out


INFORMATIVE, FLAT = [1.0, 0.0], [1.0, 1.0]


def groups_of(shard: list[dict]) -> list[str]:
    return [c.text for item in shard for c in item["completions"][::item["group_size"]]]


def test_split_deals_the_first_max_groups_informative_groups_evenly_and_the_rest_after():
    batch = items([INFORMATIVE, FLAT, INFORMATIVE, INFORMATIVE, INFORMATIVE, FLAT, INFORMATIVE, INFORMATIVE])
    shards = split_groups(batch, 2, advantages, max_groups=4)  # informative: 0 2 3 4 | 6 7 beyond the cap
    assert [groups_of(s) for s in shards] == [["g0", "g1", "g3"], ["g2", "g4", "g5"]]
    assert all(item["group_size"] == 2 and len(item["rewards"]) == len(item["completions"])
               for s in shards for item in s)


def test_split_gives_every_rank_the_same_number_of_informative_groups_or_none():
    five = items([INFORMATIVE] * 5 + [FLAT])
    shards = split_groups(five, 2, advantages)
    trained = [sum(1 for t in groups_of(s) if t != "g5") for s in shards]
    assert trained == [2, 2]  # one informative group left out: both ranks run the same passes
    one = split_groups(items([INFORMATIVE, FLAT, FLAT]), 2, advantages)
    assert sorted(t for s in one for t in groups_of(s)) == ["g1", "g2"]  # nobody trains, nobody waits


def test_rank_weights_make_the_averaged_gradient_the_whole_batch_gradient():
    torch.manual_seed(0)
    rng = random.Random(7)
    batch = items([[float(rng.random() < 0.5) for _ in range(4)] for g in range(12)], per_item=4)
    shards = split_groups(batch, 2, advantages)
    param = torch.zeros(1, requires_grad=True)

    def grad(part: list[dict], weight: float = 1.0) -> torch.Tensor:
        rows = [c for item in part for c in item["completions"]]
        rewards = torch.tensor([r for item in part for r in item["rewards"]])
        adv = advantages(rewards, 4)
        keep = (adv.view(-1, 4).abs().sum(1) > 0).repeat_interleave(4)
        width = max(len(c.token_ids) for c in rows)
        mask = torch.tensor([[1.0 if t < len(c.token_ids) else 0.0 for t in range(width)] for c in rows])[keep]
        logp = param * torch.arange(1.0, mask.numel() + 1).view_as(mask) / 100
        loss = RankWeightedLoss(grpo_loss, lambda: weight)(logp, logp.detach(), adv[keep], mask).loss
        param.grad = None
        loss.backward()
        return param.grad.clone()

    units = [grpo_units(s, advantages, "token_mean") for s in shards]
    weights = [rank_weight(u, sum(units), 2) for u in units]
    assert units[0] != units[1]  # the ranks hold different numbers of tokens: unweighted means would be wrong
    averaged = (grad(shards[0], weights[0]) + grad(shards[1], weights[1])) / 2  # what FSDP and DDP compute
    chosen = [item for s in shards for item in s]
    torch.testing.assert_close(averaged, grad(chosen))
    unweighted = (grad(shards[0]) + grad(shards[1])) / 2
    assert not torch.allclose(unweighted, grad(chosen))


def test_metrics_are_averaged_over_ranks_and_counts_summed():
    merged = merge_metrics([{"losses/loss": 1.0, "train/groups": 4.0}, {"losses/loss": 3.0, "train/groups": 2.0,
                                                                       "only/one": 5.0}], {"train/groups"})
    assert merged == {"losses/loss": 2.0, "train/groups": 6.0, "only/one": 5.0}


@pytest.mark.parametrize("kw, key", [({"ranks": 0}, "trainer.ranks"), ({"parallel": "zero3"}, "trainer.parallel"),
                                     ({"ranks": 2, "parallel": "none"}, "trainer.parallel"),
                                     ({"checkpoint_format": "safetensors"}, "trainer.checkpoint_format"),
                                     ({"publish": "broadcast"}, "trainer.publish"),
                                     ({"group_timeout_s": 0}, "trainer.group_timeout_s")])
def test_bad_mesh_settings_fail_naming_the_key(kw, key):
    with pytest.raises(ConfigError, match=key):
        GRPOConfig(**kw)


def test_the_gym_trainers_refuse_ranks():
    with pytest.raises(ConfigError, match="trainer.ranks=2 is invalid: the gym trainers"):
        PPOConfig(ranks=2)


def sharded_dir(d, step: int):
    """A stand-in for a ``step_*.dcp`` directory: files and their manifest, as ``dcp.save`` leaves them."""
    path = d / layout.name_for(step)
    path.mkdir(parents=True)
    write(path / layout.PLAIN, {"step": step}, step, step)
    (path / "__0_0.distcp").write_bytes(b"shard")
    files = {p.name: dict(zip(("sha256", "bytes"), layout.sha256_of(p))) for p in path.iterdir()}
    (path / layout.MANIFEST).write_text(json.dumps({"format": 1, "files": files}))
    return path


def test_the_newest_checkpoint_of_either_kind_is_found_and_pruning_keeps_both_kinds(tmp_path):
    write(tmp_path / "step_00000003.pt", {"step": 3}, 3, 3)
    sharded_dir(tmp_path, 2)
    assert layout.newest(tmp_path).name == "step_00000003.pt"
    four = sharded_dir(tmp_path, 4)
    (tmp_path / ".step_00000005.dcp.tmp").mkdir()  # a save that died midway
    assert layout.newest(tmp_path) == four
    layout.prune(tmp_path, 2)
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.startswith(".")) == [
        "step_00000003.json", "step_00000003.pt", "step_00000004.dcp"]


def test_a_sharded_checkpoint_with_a_changed_or_planted_file_is_refused(tmp_path):
    path = sharded_dir(tmp_path, 1)
    assert layout.verify(path)["files"]
    (path / "__0_0.distcp").write_bytes(b"evil!")
    with pytest.raises(CheckpointError, match="fails its checksum"):
        layout.verify(path)
    path = sharded_dir(tmp_path / "b", 1)
    (path / ".metadata").write_bytes(b"planted pickle")
    with pytest.raises(CheckpointError, match="missing or not in its manifest"):
        layout.verify(path)


class FakeController:
    """What :class:`RestartTogether` uses of the controller: procs, the KV, ``restart_proc``."""

    def __init__(self, n: int) -> None:
        from types import SimpleNamespace

        from rlmesh.actor.kv import LocalKV

        self.procs = {f"rl.{i}": SimpleNamespace(state="alive", incarnation=0) for i in range(1, n + 1)}
        self.kv, self.closed, self.killed = LocalKV(), False, []

    def restart_proc(self, proc_id: str, reason: str, starting: bool = False) -> bool:
        assert starting
        self.killed.append(proc_id)
        return True

    def dies(self, link, proc_id: str) -> None:
        from rlmesh.actor.hooks import ProcEvent

        rec = self.procs[proc_id]
        link(ProcEvent("died", "rl", 0, proc_id, None, "", rec.incarnation, signal=9))
        rec.state = "restarting"

    def relaunch(self, proc_id: str) -> None:
        rec = self.procs[proc_id]
        rec.incarnation += 1
        rec.state = "alive"


def test_a_dead_rank_restarts_its_peers_once_per_incident_at_a_new_epoch():
    from rlmesh.rl.train.recovery import RestartTogether, epoch_key

    c = FakeController(3)
    link = RestartTogether(c, list(c.procs))
    assert [c.kv.get(epoch_key(p)) for p in c.procs] == [0, 0, 0]
    c.dies(link, "rl.2")
    assert c.killed == ["rl.1", "rl.3"] and [c.kv.get(epoch_key(p)) for p in c.procs] == [1, 1, 1]
    for p in ("rl.1", "rl.3"):  # the peers killed for it die: no new incident
        c.dies(link, p)
    assert link.incidents == 1 and c.killed == ["rl.1", "rl.3"]
    for p in c.procs:
        c.relaunch(p)
    c.procs["rl.3"].state = "rejoining"  # still forming its group: killed too
    c.dies(link, "rl.1")  # a replacement dies: a new incident
    assert link.incidents == 2 and c.killed[2:] == ["rl.2", "rl.3"] and c.kv.get(epoch_key("rl.3")) == 2
    c.dies(link, "rl.2")  # killed for incident 2
    assert link.incidents == 2 and len(c.killed) == 4


def test_a_collective_failing_on_a_lost_peer_is_told_from_other_errors():
    from rlmesh.errors import ActorError
    from rlmesh.rl.train.recovery import peer_lost

    gloo = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
            "[127.0.0.1]:35742")
    assert peer_lost(ActorError(gloo, remote_type="builtins.RuntimeError"))
    assert peer_lost(ActorError("Read error: Connection reset by peer", remote_type="torch.DistBackendError"))
    assert not peer_lost(ActorError("shape mismatch", remote_type="builtins.RuntimeError"))
    assert not peer_lost(ActorError(gloo, remote_type="ValueError"))
