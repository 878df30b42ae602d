"""The trainer mesh (``trainer.ranks=2``): real procs, a real gloo group, FSDP2 and DDP.

The same batches go to a one-rank trainer and to a two-rank mesh, through a buffer actor that
serves fixed batches, and the weights they end with are compared: a data-parallel step must be
the one-rank step (same groups trained, losses weighted to the whole batch's mean). The sharded
checkpoint the mesh writes loads into one rank, and a one-rank checkpoint into the mesh.

A process belongs to one default process group for its life, so each mesh gets procs of its own;
trainers of one rank (no group) share proc 0 with the buffers.
"""

from __future__ import annotations

import random
import time
from pathlib import Path

import pytest
import torch

import rlmesh as rm
from rlmesh.rl.algorithms.grpo import GRPOTrainer, grpo_advantages, grpo_loss
from rlmesh.rl.backends.base import Completion
from rlmesh.rl.batching import completions_to_generation
from rlmesh.rl.buffer import BufferedRollout, SampleResult
from rlmesh.rl.checkpoint import read
from rlmesh.rl.backends.torch_backend import build_policy_model
from rlmesh.rl.config import GRPOConfig, LoRAConfig
from rlmesh.rl.models import TransformerConfig
from rlmesh.rl.models.hf import adapter_state_dict
from rlmesh.rl.models.sampling import sequence_logprobs
from rlmesh.rl.models.transformer import Transformer
from rlmesh.rl.run.placement import call_trainer, trainer_procs
from rlmesh.rl.train.clock import local_bytes
from rlmesh.rl.train.layout import newest, verify
from rlmesh.weights import Subscriber
from _support.waiting import wait_for

MODEL = TransformerConfig(vocab_size=16, max_seq_len=12, d_model=32, n_layers=2, n_heads=4)
LORA = LoRAConfig(r=4)


def scored_items(seed: int, items: int = 2, groups: int = 6, group_size: int = 4) -> list[dict]:
    """Work items as LLMGenerator hands them to the buffer: random completions, 0/1 rewards."""
    rng = random.Random(seed)
    out = []
    for _ in range(items):
        completions, rewards = [], []
        for _ in range(groups):
            prompt = [rng.randrange(3, 16) for _ in range(rng.randint(2, 4))]
            for _ in range(group_size):
                t = rng.randint(1, 5)
                completions.append(Completion(prompt, [rng.randrange(3, 16) for _ in range(t)], [0.0] * t))
                rewards.append(float(rng.random() < 0.5))
        out.append({"completions": completions, "rewards": rewards, "group_size": group_size,
                    "logprobs_exact": False})  # the trainer takes the behaviour log-probs itself
    return out


class FixedBuffer(rm.Actor):
    """Serves the given batches in turn, as ``ReplayBuffer.sample`` would."""

    def __init__(self, batches: list[list[dict]]) -> None:
        self.batches, self.calls = batches, 0

    @rm.endpoint
    def sample(self, batch_size: int, version: int, timeout: float, cursor: int = 0, durable: int = 0) -> SampleResult:
        self.calls += 1
        items = self.batches[(self.calls - 1) % len(self.batches)]
        return SampleResult([BufferedRollout(f"b{self.calls}-{i}", version, item, len(item["completions"]))
                             for i, item in enumerate(items)], max_lag=0, lease=self.calls)


class Puller(rm.Actor):
    """A generator's side of weight sync: pulls the policy into its own model."""

    def __init__(self, weights: str) -> None:
        self.model = Transformer(MODEL)
        self.sub = Subscriber(weights)

    @rm.endpoint
    def pull(self, min_version: int) -> tuple[int, dict[str, torch.Tensor]]:
        v = self.sub.pull_into(self.model, min_version=min_version, timeout=60)
        return int(v), {k: t.clone() for k, t in self.model.state_dict().items()}


class Reffed(GRPOTrainer):
    """A GRPO trainer that says how many bytes of its KL reference's parameters this rank holds."""

    @rm.endpoint
    def reference_bytes(self) -> int:
        assert self.ref_model is not None
        return local_bytes(self.ref_model.parameters())

    @rm.endpoint
    def reference_state(self) -> dict[str, torch.Tensor]:
        assert self.ref_model is not None
        return {k: t.clone() for k, t in self.ref_model.state_dict().items()}

    @rm.endpoint
    def kl_on(self, items: list[dict]) -> tuple[torch.Tensor, dict[str, float]]:
        """The reference's log-probs of the completions of ``items`` (all of them, on every rank), and
        GRPO's loss metrics against it with the current policy as the behaviour policy."""
        gen = completions_to_generation([c for item in items for c in item["completions"]], self.pad_id)
        with torch.no_grad():
            ref = sequence_logprobs(self.ref_model, gen.input_ids, gen.attention_mask, gen.prompt_len)
            new = sequence_logprobs(self.model, gen.input_ids, gen.attention_mask, gen.prompt_len)
        rewards = torch.tensor([r for item in items for r in item["rewards"]])
        out = grpo_loss(new, new, grpo_advantages(rewards, items[0]["group_size"]), gen.completion_mask.float(),
                        ref_logprobs=ref, kl_coef=self.config.kl_coef)
        return ref * gen.completion_mask, {k: float(v) for k, v in out.metrics().items()}


def config(tmp: Path, ranks: int, **kw) -> GRPOConfig:
    return GRPOConfig(lr=1e-2, max_groups=8, ranks=ranks, checkpoint_dir=str(tmp), checkpoint_every=1,
                      **{"group_timeout_s": 120, **kw})


def weights_of(path: Path) -> dict[str, torch.Tensor]:
    """The model weights of a checkpoint of either kind, read in the controller (a sharded one through
    a plain one-rank model: DCP reshards it)."""
    if path.is_dir():
        from rlmesh.rl.train import dcp

        model = Transformer(MODEL)
        dcp.load(path, model, torch.optim.Adam(model.parameters()))
        return model.state_dict()
    return read(path)["model"]


def ref_bytes(mesh: str) -> list[int]:
    """``train_ranks.ref_bytes`` of trainer mesh ``mesh``, one per rank (the same at every step)."""
    rows = rm.telemetry.query(f"SELECT rank, min(ref_bytes) AS lo, max(ref_bytes) AS hi FROM train_ranks "
                              f"WHERE mesh = '{mesh}' GROUP BY rank ORDER BY rank").to_pylist()
    return [r["lo"] for r in rows if r["lo"] == r["hi"]]


def dcp_keys(path: Path) -> set[str]:
    """The tensor names a DCP directory holds (its metadata, read in the controller)."""
    from torch.distributed.checkpoint import FileSystemReader

    return set(FileSystemReader(str(path)).read_metadata().state_dict_metadata)


def train_steps(procs, first: int, ranks: int, tmp: Path, batches, steps: int, name: str, **kw):
    buffer = procs.slice(procs=0).spawn(f"buffer_{name}", FixedBuffer, batches)
    trainer = trainer_procs(procs, first, ranks).spawn(f"trainer_{name}", Reffed, config(tmp, ranks, **kw),
                                                       buffer, MODEL, weights=name, seed=0)
    results = [call_trainer(trainer, "train", 4, 10.0).get(timeout=120) for _ in range(steps)]
    return trainer, results


@pytest.mark.timeout(240)
@pytest.mark.parametrize("parallel", ["fsdp", "ddp"])
def test_two_ranks_take_the_one_rank_step_and_checkpoints_cross_rank_counts(tmp_path, parallel):
    batches = [scored_items(1), scored_items(2)]
    with rm.this_host().spawn_procs(per_host={"procs": 5}) as procs:
        single, one = train_steps(procs, 0, 1, tmp_path / "one", batches, 2, f"one_{parallel}", kl_coef=0.5)
        mesh, two = train_steps(procs, 1, 2, tmp_path / "two", batches, 2, f"two_{parallel}", parallel=parallel,
                                publish="sharded" if parallel == "fsdp" else "gathered", kl_coef=0.5)
        # the KL reference is spread like the policy: FSDP2 leaves each rank about half of it, DDP all of it
        whole = single.reference_bytes.call_one().get(timeout=60)
        per_rank = mesh.reference_bytes.call().get(timeout=60).values()
        assert sum(per_rank) == (whole if parallel == "fsdp" else 2 * whole)
        for held in per_rank:
            assert held == pytest.approx(whole / 2, rel=0.1) if parallel == "fsdp" else held == whole
        # and SQL has them per rank, beside the policy's parameter and optimizer bytes (train_ranks.ref_bytes)
        assert wait_for(lambda: ref_bytes(f"trainer_two_{parallel}") == list(per_rank), 60, "train_ranks of the mesh", 0.5)
        assert wait_for(lambda: ref_bytes(f"trainer_one_{parallel}") == [whole], 60, "train_ranks of one rank", 0.5)
        # the same reference log-probs, KL and loss on the same batch (every rank runs the sharded forward)
        ref_one, kl_one = single.kl_on.call_one(batches[0]).get(timeout=60)
        ref_two, kl_two = mesh.kl_on.call(batches[0]).get(timeout=60).values()[0]
        torch.testing.assert_close(ref_two, ref_one, atol=1e-5, rtol=1e-5)
        assert kl_one["losses/kl"] > 1e-5  # two steps away from the reference
        for k in ("losses/kl", "losses/loss"):
            assert kl_two[k] == pytest.approx(kl_one[k], rel=1e-3), k
        assert one[0].metric("losses/kl") == 0.0 and one[1].metric("losses/kl") > 0.0  # it trained against it
        # the same step, counted once: rank 0 answers for the mesh with the whole batch's numbers
        assert [r.trained for r in two] == [True, True] and [r.step for r in two] == [1, 2]
        assert [r.samples for r in two] == [r.samples for r in one] == [48, 48]
        for a, b in zip(one, two):
            assert a.metric("train/groups") == b.metric("train/groups") == 8  # max_groups, split 4 + 4
            # the same gradient: each rank's loss weighed by its share of the batch's tokens
            assert b.metric("train/grad_norm") == pytest.approx(a.metric("train/grad_norm"), rel=1e-4)
        ck_one, ck_two = newest(tmp_path / "one"), newest(tmp_path / "two")
        assert ck_one.name == "step_00000002.pt" and ck_two.name == "step_00000002.dcp"
        assert sorted(p.name for p in ck_two.iterdir() if p.name.endswith(".distcp")) == ["__0_0.distcp",
                                                                                           "__1_0.distcp"]
        # the reference (a copy of the post-warm-start policy, not the model as built) is saved by every
        # rank as its shard in the DCP directory, like the policy; rank 0's trainer.pt holds none of it
        assert read(ck_two / "trainer.pt")["extra"] == {"ref": "checkpoint"}
        assert any(k.startswith("frozen.ref_model.") for k in dcp_keys(ck_two))
        w_one, w_two = weights_of(ck_one), weights_of(ck_two)
        # what a generator pulls, from every rank's shards (fsdp) or from rank 0's gathered whole (ddp),
        # is the checkpoint's weights bit for bit
        puller = procs.slice(procs=0).spawn(f"puller_{parallel}", Puller, f"two_{parallel}")
        v, pulled = puller.pull.call_one(2).get(timeout=60)
        assert v == 2 and set(pulled) == set(w_two) and all(torch.equal(pulled[k], w_two[k]) for k in w_two)
        torch.manual_seed(0)  # the trainers' seed: their starting weights
        start = Transformer(MODEL).state_dict()
        moved = max(float((w_one[k] - start[k]).abs().max()) for k in w_one)
        assert moved > 1e-3  # it trained
        for k in w_one:
            torch.testing.assert_close(w_two[k], w_one[k], atol=1e-4, rtol=1e-3)  # Adam: a 1e-2 step
        call_trainer(mesh, "save").get(timeout=60)  # the controller's final save: every rank writes its shard

        # the two-rank sharded checkpoint resumes one rank, and the one-rank file resumes two ranks
        back_one = trainer_procs(procs, 0, 1).spawn(f"back1_{parallel}", Reffed,
                                                    config(tmp_path / "two", 1, kl_coef=0.5), None, MODEL,
                                                    weights=f"back1_{parallel}")
        back_two = trainer_procs(procs, 3, 2).spawn(f"back2_{parallel}", Reffed,
                                                    config(tmp_path / "one", 2, parallel=parallel, kl_coef=0.5),
                                                    None, MODEL, weights=f"back2_{parallel}")
        assert call_trainer(back_one, "state").get(timeout=60).step == 2
        assert call_trainer(back_two, "state").get(timeout=60).step == 2
        # the reference comes back too: gathered into the mesh's checkpoint, sharded again from one rank's
        torch.testing.assert_close(back_one.kl_on.call_one(batches[0]).get(timeout=60)[0], ref_one)
        torch.testing.assert_close(back_two.kl_on.call(batches[0]).get(timeout=60).values()[0][0], ref_one)
        p1 = Path(call_trainer(back_one, "save", str(tmp_path / "again1.pt")).get(timeout=60))
        p2 = Path(call_trainer(back_two, "save", str(tmp_path / "again2.dcp")).get(timeout=60))
        for k, v in weights_of(p1).items():
            torch.testing.assert_close(v, w_two[k])
        for k, v in weights_of(p2).items():
            torch.testing.assert_close(v, w_one[k])


@pytest.mark.timeout(120)
def test_a_one_rank_trainer_can_write_sharded_checkpoints_that_two_ranks_resume(tmp_path):
    batches = [scored_items(3)]
    with rm.this_host().spawn_procs(per_host={"procs": 3}) as procs:
        _, res = train_steps(procs, 0, 1, tmp_path, batches, 1, "dcp1", checkpoint_format="dcp")
        assert newest(tmp_path).name == "step_00000001.dcp"
        resumed = trainer_procs(procs, 1, 2).spawn("dcp2", GRPOTrainer, config(tmp_path, 2), None, MODEL,
                                                   weights="dcp2")
        state = call_trainer(resumed, "state").get(timeout=60)
        assert (state.step, state.samples_seen) == (1, res[0].samples_seen)
        # a version never repeats: the resumed mesh publishes past the newest version of its name
        assert state.policy_version == 1


class GatedBuffer(FixedBuffer):
    """:class:`FixedBuffer` whose ``sample`` marks that it was asked (``asked<n>`` in ``marks``) and
    answers only while the file ``open`` exists there; it keeps the cursors it was given."""

    def __init__(self, batches: list[list[dict]], marks: str) -> None:
        super().__init__(batches)
        self.marks, self.cursors = Path(marks), []

    @rm.endpoint
    def sample(self, batch_size: int, version: int, timeout: float, cursor: int = 0, durable: int = 0) -> SampleResult:
        self.cursors.append(cursor)
        (self.marks / f"asked{len(self.cursors)}").touch()
        while not (self.marks / "open").exists():  # a condition, polled: the test opens it
            time.sleep(0.01)
        return super().sample(batch_size, version, timeout, cursor, durable)

    @rm.endpoint
    def seen(self) -> list[int]:
        return list(self.cursors)


def fails_with_a_dead_rank(step) -> None:
    """The mesh call fails with the dead rank's ``ActorDied``, or first with the survivor's gloo error
    (gloo sees the peer gone within milliseconds, sometimes before the supervisor reaps it)."""
    from rlmesh.rl.train.recovery import peer_lost

    try:
        step.get(timeout=120)
    except rm.ActorDied:
        return
    except rm.ActorError as exc:
        assert peer_lost(exc), exc
        return
    pytest.fail("the step of a killed rank returned")


@pytest.mark.timeout(240)
def test_a_killed_rank_restarts_the_whole_mesh_at_a_new_epoch_from_its_checkpoint(tmp_path):
    from rlmesh.actor import hooks, kv
    from rlmesh.actor.controller import Controller
    from rlmesh.rl.train.recovery import epoch_key

    events: list[tuple[str, str, int]] = []
    sink = lambda ev: events.append((ev.kind, ev.proc_id, ev.incarnation))  # noqa: E731
    hooks.add_event_sink(sink)
    marks = tmp_path / "marks"
    marks.mkdir()
    (marks / "open").touch()
    try:
        with rm.this_host().spawn_procs(per_host={"procs": 3}, restart=rm.Restart(max_restarts=-1)) as procs:
            buffer = procs.slice(procs=0).spawn("gated", GatedBuffer, [scored_items(4)], str(marks))
            # a group timeout far past the test's: the peer must be freed by the restart, not by gloo
            trainer = trainer_procs(procs, 1, 2).spawn("killed", GRPOTrainer, config(tmp_path / "ck", 2,
                                                                                     group_timeout_s=900),
                                                       buffer, MODEL, weights="killed", seed=0)
            assert call_trainer(trainer, "train", 4, 10.0).get(timeout=120).step == 1  # checkpointed
            (marks / "open").unlink()
            step = call_trainer(trainer, "train", 4, 10.0)
            wait_for((marks / "asked2").exists, 120, "rank 0 samples step 2")
            # rank 0 waits on the buffer, rank 1 on rank 0's hand-off (a collective): kill rank 0
            rank0, rank1 = trainer_procs(procs, 1, 2)._proc_ids[1:3]
            killed_at = time.monotonic()
            assert Controller.current().inject_fault(rank0, "kill")
            fails_with_a_dead_rank(step)
            (marks / "open").touch()
            wait_for(lambda: procs.slice(procs=slice(1, 3)).incarnations() == [1, 1]
                     and procs.slice(procs=slice(1, 3)).states() == ["alive", "alive"], 120, "both ranks back")
            back_s = time.monotonic() - killed_at
            assert ("restart_requested", rank1, 0) in events and ("restarted", rank1, 1) in events
            assert kv.get(epoch_key(rank0), timeout=0) == kv.get(epoch_key(rank1), timeout=0) == 1
            state = call_trainer(trainer, "state").get(timeout=60)
            assert (state.step, state.policy_version) == (1, 2)  # step 1's checkpoint; a version past 1
            after = call_trainer(trainer, "train", 4, 10.0).get(timeout=120)
            assert after.trained and after.step == 2
            # the dead step's lease was after the checkpoint's cursor (1): the buffer hears cursor 1 again
            assert buffer.seen.call_one().get(timeout=30) == [0, 1, 1]
            print(f"mesh back {back_s:.2f} s after rank 0 was killed")
    finally:
        hooks.remove_event_sink(sink)


@pytest.mark.timeout(180)
def test_a_model_folder_exported_from_two_ranks_is_the_whole_model(tmp_path):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "src")
    want = transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "src").state_dict()
    with rm.this_host().spawn_procs(per_host={"procs": 3}) as procs:
        mesh = trainer_procs(procs, 0, 2).spawn("export2", Reffed, config(tmp_path / "ck", 2, sft_steps=0, kl_coef=0.5),
                                                None, None, str(tmp_path / "src"), weights="export2")
        out = call_trainer(mesh, "export", str(tmp_path / "out")).get(timeout=120)  # FSDP: every rank gathers
        # a KL reference that is the model folder as loaded is not saved: a resumed trainer rebuilds it
        ck = Path(call_trainer(mesh, "save").get(timeout=60))
        assert read(ck / "trainer.pt")["extra"] == {"ref": "folder"}
        assert not any(k.startswith("frozen.") for k in dcp_keys(ck))
        back = trainer_procs(procs, 2, 1).spawn("export2_back", Reffed, config(tmp_path / "ck", 1, sft_steps=0,
                                                                                kl_coef=0.5),
                                                None, None, str(tmp_path / "src"), weights="export2_back")
        ref = back.reference_state.call_one().get(timeout=60)
    assert set(ref) == {f"model.{k}" for k in want}
    for k in want:
        torch.testing.assert_close(ref[f"model.{k}"], want[k], atol=0, rtol=0)
    assert Path(out) == tmp_path / "out"
    got = transformers.AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert set(got) == set(want)
    for k in want:
        torch.testing.assert_close(got[k], want[k])


class LoraPuller(rm.Actor):
    """A generator of a LoRA policy: its own copy of the folder with the adapters the trainer's seed
    gives, into which it pulls the adapters (all a version carries)."""

    def __init__(self, folder: str, weights: str) -> None:
        torch.manual_seed(0)  # the trainer's seed: the adapters of its version 0
        self.model = build_policy_model(None, folder, "float32", LORA)[0]
        self.start = {k: t.clone() for k, t in adapter_state_dict(self.model).items()}
        self.sub = Subscriber(weights)

    @rm.endpoint
    def pull(self, min_version: int) -> tuple[int, dict[str, torch.Tensor], dict[str, torch.Tensor]]:
        target = adapter_state_dict(self.model)
        for t in target.values():
            t.data.fill_(7.0)
        v = self.sub.pull_into(target, min_version=min_version, timeout=60)  # keys must match: adapters only
        return int(v), {k: t.clone() for k, t in target.items()}, self.start


@pytest.mark.timeout(180)
def test_a_lora_mesh_trains_publishes_its_adapters_in_shards_and_exports_them_merged(tmp_path):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=32, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=32)
    torch.manual_seed(0)
    transformers.LlamaForCausalLM(cfg).save_pretrained(tmp_path / "src")
    src = str(tmp_path / "src")
    with rm.this_host().spawn_procs(per_host={"procs": 3}) as procs:
        buffer = procs.slice(procs=0).spawn("buffer_lora", FixedBuffer, [scored_items(8)])
        mesh = trainer_procs(procs, 1, 2).spawn("lora2", GRPOTrainer, config(tmp_path / "ck", 2, sft_steps=0),
                                                buffer, None, src, weights="lora2", seed=0, lora=LORA)
        puller = procs.slice(procs=0).spawn("lora_puller", LoraPuller, src, "lora2")
        v, got, start = puller.pull.call_one(0).get(timeout=60)
        assert v == 0 and set(got) == set(start) and all("lora_" in k for k in got)
        assert all(torch.equal(got[k], start[k]) for k in start)  # every rank's part, bit for bit
        assert call_trainer(mesh, "train", 4, 10.0).get(timeout=120).policy_version == 1
        v, got, _ = puller.pull.call_one(1).get(timeout=60)
        assert v == 1 and any(not torch.equal(got[k], start[k]) for k in start)  # the adapters trained
        out = call_trainer(mesh, "export", str(tmp_path / "out")).get(timeout=120)  # every rank gathers
    # the export is an ordinary folder: the trained adapters merged into the base weights, as on one rank
    merged = build_policy_model(None, src, "float32", LORA)[0]
    merged.load_state_dict({**merged.state_dict(), **got})
    want = merged.model.merge_and_unload().state_dict()
    exported = transformers.AutoModelForCausalLM.from_pretrained(out).state_dict()
    assert set(exported) == set(want) and not any("lora_" in k for k in exported)
    base = transformers.AutoModelForCausalLM.from_pretrained(src).state_dict()
    assert any(not torch.equal(exported[k], base[k]) for k in base)
    for k in want:
        torch.testing.assert_close(exported[k], want[k])


def hold_while(marks: Path) -> None:
    """In an actor: if the file ``hold`` exists in ``marks``, say so (``in_hold``) and stay until killed."""
    if (marks / "hold").exists():
        (marks / "in_hold").touch()
        while True:
            time.sleep(0.01)


class Held(GRPOTrainer):
    """A mesh rank that stops, on rank 0 and while the file ``hold`` exists in ``marks``, inside its
    sharded save (every shard on disk, the checkpoint not yet whole: its ``trainer.pt``, manifest and
    rename to come) or inside its publish (the version reserved in the KV, nothing published yet): a
    kill there is a kill mid-checkpoint or mid-publish."""

    def __init__(self, *args, marks: str, where: str, **kwargs) -> None:
        from types import SimpleNamespace

        from rlmesh.rl.train import dcp

        held = Path(marks)
        if where == "save":
            real = dcp.checkpoint
            dcp.checkpoint = SimpleNamespace(read=real.read, write=lambda *a, **k: (hold_while(held),
                                                                                   real.write(*a, **k))[1])
        super().__init__(*args, **kwargs)
        pub = self.publisher or (self.shards if self.group is not None and self.group.rank == 0 else None)
        if where == "publish" and pub is not None:  # rank 0's publisher, of the whole model or of its part
            publish = pub.publish
            pub.publish = lambda *a, **k: (hold_while(held), publish(*a, **k))[1]  # type: ignore[method-assign]


def kill_rank0_held(procs, trainer, marks: Path) -> None:
    """Train step 1, hold rank 0 in step 2, kill it there; return once both ranks serve again."""
    from rlmesh.actor.controller import Controller

    assert call_trainer(trainer, "train", 4, 10.0).get(timeout=120).step == 1
    (marks / "hold").touch()
    step = call_trainer(trainer, "train", 4, 10.0)
    wait_for((marks / "in_hold").exists, 120, "rank 0 held in step 2")
    (marks / "hold").unlink()
    # rank 1 waits in a collective (the save's last barrier; after publishing its part, the next save's
    # first barrier; gathered, the version broadcast)
    assert Controller.current().inject_fault(trainer_procs(procs, 1, 2)._proc_ids[1], "kill")
    fails_with_a_dead_rank(step)
    wait_for(lambda: procs.slice(procs=slice(1, 3)).incarnations() == [1, 1]
             and procs.slice(procs=slice(1, 3)).states() == ["alive", "alive"], 120, "both ranks back")


@pytest.mark.timeout(240)
def test_a_rank_killed_mid_checkpoint_leaves_the_previous_one_to_load(tmp_path):
    marks, ck = tmp_path / "marks", tmp_path / "ck"
    marks.mkdir()
    with rm.this_host().spawn_procs(per_host={"procs": 3}, restart=rm.Restart(max_restarts=-1)) as procs:
        buffer = procs.slice(procs=0).spawn("fixed_ck", FixedBuffer, [scored_items(5)])
        trainer = trainer_procs(procs, 1, 2).spawn("held_ck", Held, config(ck, 2, group_timeout_s=900), buffer,
                                                   MODEL, weights="held_ck", seed=0, marks=str(marks), where="save")
        kill_rank0_held(procs, trainer, marks)
        assert call_trainer(trainer, "state").get(timeout=60).step == 1  # the half-written step 2 is not loaded
        assert call_trainer(trainer, "train", 4, 10.0).get(timeout=120).step == 2
    assert sorted(p.name for p in ck.iterdir()) == ["step_00000001.dcp", "step_00000002.dcp"]
    assert verify(ck / "step_00000002.dcp")["step"] == 2


@pytest.mark.timeout(240)
def test_a_rank_killed_mid_publish_never_lets_a_version_repeat(tmp_path):
    from rlmesh.actor import kv

    marks, ck = tmp_path / "marks", tmp_path / "ck"
    marks.mkdir()
    with rm.this_host().spawn_procs(per_host={"procs": 3}, restart=rm.Restart(max_restarts=-1)) as procs:
        buffer = procs.slice(procs=0).spawn("fixed_pub", FixedBuffer, [scored_items(6)])
        trainer = trainer_procs(procs, 1, 2).spawn("held_pub", Held, config(ck, 2, group_timeout_s=900), buffer,
                                                   MODEL, weights="held_pub", seed=0, marks=str(marks),
                                                   where="publish")
        kill_rank0_held(procs, trainer, marks)
        # version 2 was reserved, never published; the replacement publishes step 1's weights past it
        state = call_trainer(trainer, "state").get(timeout=60)
        assert (state.step, state.policy_version) == (1, 3)
        assert kv.get("rlmesh.rl/weights/held_pub/newest_version", timeout=0) == 3
        after = call_trainer(trainer, "train", 4, 10.0).get(timeout=120)
        assert (after.step, after.policy_version) == (2, 4)
