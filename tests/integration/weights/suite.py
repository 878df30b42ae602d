"""The contract every weight transport passes: one class of cases, one subclass per transport.

Publisher and Subscriber run in this process (the server thread stands in for the
remote side); ``test_processes.py`` and ``test_stress.py`` repeat the key cases across
real processes.
"""

from __future__ import annotations

import logging
import threading
import time

import numpy as np
import pytest
import torch

from rlmesh.actor.kv import LocalKV
from rlmesh.weights import Publisher, StateDictMismatchError, Subscriber, WeightSyncError
from rlmesh.weights import assemble

DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.int16, torch.int32,
          torch.int64, torch.uint8, torch.bool, torch.complex64]


def make_sd(version: int, device: str = "cpu") -> dict:
    g = torch.Generator().manual_seed(version)
    sd = {}
    for i, dt in enumerate(DTYPES):
        base = torch.randn(3, 5 + i, generator=g) * 50
        sd[f"t.{dt}".replace("torch.", "")] = (base > 0) if dt == torch.bool else base.to(dt)
    sd["scalar"] = torch.tensor(float(version))
    sd["empty"] = torch.zeros(0, 3)
    sd["noncontig"] = torch.randn(6, 4, generator=g).t()  # strided input
    sd["sliced"] = torch.randn(10, 10, generator=g)[::2, 1::3]
    sd["big"] = torch.randn(3 << 20, generator=g)  # 12 MiB: several TCP chunks
    sd = {k: v.to(device) for k, v in sd.items()}
    sd["np.f32"] = np.random.default_rng(version).standard_normal((4, 7)).astype(np.float32)
    sd["np.i64.strided"] = np.arange(40, dtype=np.int64).reshape(5, 8)[:, ::2] + version
    return sd


def same(a, b) -> bool:
    a = torch.as_tensor(a).cpu() if not isinstance(a, np.ndarray) else torch.from_numpy(np.ascontiguousarray(a))
    b = torch.as_tensor(b).cpu() if not isinstance(b, np.ndarray) else torch.from_numpy(np.ascontiguousarray(b))
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


def zeros_like_sd(sd: dict) -> dict:
    return {k: (np.zeros_like(v) if isinstance(v, np.ndarray) else torch.zeros_like(v.contiguous())) for k, v in sd.items()}


def snapshot(sd: dict) -> dict:
    return {k: (v.copy() if isinstance(v, np.ndarray) else v.clone()) for k, v in sd.items()}


@pytest.mark.timeout(60)
class TransportSuite:
    transport: str = ""
    device: str = "cpu"

    @pytest.fixture
    def transport_setup(self):
        """Subclasses override this to prepare their transport (e.g. install emulated verbs)."""
        yield

    @pytest.fixture
    def env(self, transport_setup):
        d = LocalKV()
        pub = Publisher(f"w-{self.transport}", directory=d)
        sub = Subscriber(f"w-{self.transport}", self.transport, directory=d)
        yield pub, sub
        sub.close()
        pub.close()

    def corrupt(self, pub: Publisher, version: int, key: str) -> None:
        slot = next(s for s in pub.pool.slots if s.version == version)
        e = next(e for e in pub._manifest_of(slot).entries if e.key == key)
        if self.device != "cpu":
            slot.extra["cuda"]["buf"][e.offset + 1] += 1
        pos = slot.data_off + e.offset + 1
        slot.mm[pos] = slot.mm[pos] ^ 0x5A

    def test_roundtrip_every_dtype_and_layout(self, env):
        pub, sub = env
        sd = make_sd(1, self.device)
        pub.publish(sd, version=1)
        out, v = sub.pull(device=self.device if self.device != "cpu" else None)
        assert v == 1 and list(out) == list(sd)
        for k in sd:
            assert same(out[k], sd[k]), k
        assert isinstance(out["np.f32"], np.ndarray)
        assert v.stats.transport == self.transport and v.stats.version == 1
        assert v.stats.bytes == sum(e.nbytes for e in pub._manifest_of(pub.pool.slots[0]).entries)

    def test_pull_into_copies_in_place_without_reallocating(self, env):
        pub, sub = env
        sd = make_sd(2, self.device)
        pub.publish(sd, version=2)
        target = zeros_like_sd(sd)
        ptrs = {k: (v.ctypes.data if isinstance(v, np.ndarray) else v.data_ptr()) for k, v in target.items()}
        assert sub.pull_into(target, min_version=2) == 2
        for k in sd:
            assert same(target[k], sd[k]), k
            assert ptrs[k] == (target[k].ctypes.data if isinstance(target[k], np.ndarray) else target[k].data_ptr())

    def test_pull_into_module_and_strided_targets(self, env):
        pub, sub = env
        src = torch.nn.Linear(8, 4).to(self.device)
        dst = torch.nn.Linear(8, 4).to(self.device)
        pub.publish(src.state_dict(), version=1)
        sub.pull_into(dst)
        assert torch.equal(src.weight, dst.weight) and torch.equal(src.bias, dst.bias)
        pub.publish({"w": torch.arange(12.0, device=self.device).reshape(3, 4)}, version=2)
        target = {"w": torch.zeros(4, 3, device=self.device).t()}  # non-contiguous target
        sub.pull_into(target)
        assert torch.equal(target["w"], torch.arange(12.0, device=self.device).reshape(3, 4))

    def test_dtype_cast_on_pull(self, env):
        pub, sub = env
        sd = make_sd(3, self.device)
        pub.publish(sd, version=3)
        out, _ = sub.pull(dtype=torch.bfloat16)
        assert out["t.float32"].dtype == torch.bfloat16
        assert torch.equal(out["t.float32"].cpu(), sd["t.float32"].to(torch.bfloat16).cpu())
        assert out["t.int64"].dtype == torch.int64 and out["t.bool"].dtype == torch.bool  # only floats are cast
        target = {k: (torch.zeros(v.shape, dtype=torch.bfloat16, device=self.device)
                      if isinstance(v, torch.Tensor) and v.is_floating_point() else zeros_like_sd({k: v})[k])
                  for k, v in sd.items()}
        sub.pull_into(target, dtype=torch.bfloat16)
        assert torch.equal(target["t.float64"].cpu(), sd["t.float64"].to(torch.bfloat16).cpu())
        with pytest.raises(StateDictMismatchError) as ei:
            sub.pull_into(zeros_like_sd(sd), dtype=torch.bfloat16)
        assert ei.value.key == "t.float32"

    def test_mismatch_names_first_bad_key_and_leaves_target_untouched(self, env):
        pub, sub = env
        sd = make_sd(4, self.device)
        pub.publish(sd, version=4)
        target = zeros_like_sd(sd)
        target["t.int16"] = torch.full_like(target["t.int16"], 9)  # values that must survive
        target["sliced"] = torch.zeros(2, 2, device=self.device)  # wrong shape, later key
        before = snapshot(target)
        with pytest.raises(StateDictMismatchError) as ei:
            sub.pull_into(target)
        assert ei.value.key == "sliced" and "(5, 3)" in str(ei.value)
        assert all(same(target[k], before[k]) for k in target)
        del target["sliced"]
        with pytest.raises(StateDictMismatchError) as ei:
            sub.pull_into(target)
        assert ei.value.key == "sliced" and "missing" in str(ei.value)

    def test_corrupt_bytes_raise_and_leave_target_untouched(self, env):
        pub, sub = env
        sd = make_sd(5, self.device)
        pub.publish(sd, version=5)
        self.corrupt(pub, 5, "np.f32")  # a late key: earlier ones must not have been copied either
        target = zeros_like_sd(sd)
        before = snapshot(target)
        with pytest.raises(WeightSyncError, match="checksum mismatch on 'np.f32'"):
            sub.pull_into(target)
        assert all(same(target[k], before[k]) for k in target)
        pub.publish(make_sd(6, self.device), version=6)  # a good version afterwards is delivered
        assert sub.pull_into(target) == 6 and same(target["big"], make_sd(6, self.device)["big"])

    def test_versions_are_monotonic(self, env):
        pub, _ = env
        pub.publish({"a": torch.zeros(1)}, version=3)
        with pytest.raises(ValueError, match="monotonic"):
            pub.publish({"a": torch.zeros(1)}, version=3)

    def test_latest_version_and_keep_last_n(self, env, caplog):
        pub, sub = env
        assert sub.latest_version() is None
        for v in range(1, 6):
            pub.publish({"a": torch.full((4,), float(v), device=self.device)}, version=v)
            assert sub.latest_version() == v
        assert pub.versions() == [5, 4]
        out, v = sub.pull(version=4)
        assert v == 4 and out["a"][0].item() == 4.0 and not v.stats.dropped
        with caplog.at_level(logging.WARNING, logger="rlmesh.weights.subscriber"):
            out, v = sub.pull(version=2)
        assert v == 5 and v.stats.dropped and v.stats.requested == 2 and out["a"][0].item() == 5.0
        assert "version 2 is no longer kept" in caplog.text

    def test_min_version_waits_then_times_out(self, env):
        pub, sub = env
        pub.publish({"a": torch.zeros(2, device=self.device)}, version=1)
        threading.Timer(0.3, lambda: pub.publish({"a": torch.ones(2, device=self.device)}, version=2)).start()
        t0 = time.monotonic()
        out, v = sub.pull(min_version=2, timeout=10)
        assert v == 2 and time.monotonic() - t0 >= 0.25 and out["a"].sum().item() == 2
        with pytest.raises(WeightSyncError, match="no version >= 9"):
            sub.pull(min_version=9, timeout=0.3)

    def test_a_held_version_survives_newer_publishes(self, env):
        """A slow reader finishes the version it started: the publisher writes elsewhere meanwhile."""
        pub, sub = env
        pub.publish(make_sd(1, self.device), version=1)
        reader = sub._transport(self.device != "cpu", 5)
        held = reader.fetch(1, None, 5)
        try:
            for v in range(2, 6):
                pub.publish(make_sd(v, self.device), version=v)
            assemble.verify(held.manifest, held.sources)  # still version 1, intact
            out = assemble.materialize(held.manifest, held.sources)
            assert held.manifest.version == 1 and same(out["big"], make_sd(1, self.device)["big"])
        finally:
            held.release()
        assert sub.pull()[1] == 5

    def test_each_pull_records_a_weight_syncs_row(self, env, monkeypatch):
        from rlmesh import telemetry

        rows = []
        monkeypatch.setattr(telemetry, "record", lambda table, **row: rows.append((table, row)))
        pub, sub = env
        pub.publish({"a": torch.ones(3, device=self.device)}, version=1)
        sub.pull()
        self.corrupt(pub, 1, "a")
        with pytest.raises(WeightSyncError):
            sub.pull()
        assert [t for t, _ in rows] == ["weight_syncs", "weight_syncs"]
        (_, good), (_, bad) = rows
        assert good["ok"] is True and bad["ok"] is False
        assert good["version"] == 1 and good["bytes"] == 12 and good["transport"] == self.transport.replace("-", "_")
        assert good["duration_s"] > 0 and good["reader"]

    def test_pull_into_parameters_that_require_grad(self, env):
        pub, sub = env
        src = torch.nn.Linear(2048, 2048).to(self.device)  # 16 MiB weight: the parallel copy path
        dst = torch.nn.Linear(2048, 2048).to(self.device)
        pub.publish(src.state_dict(), version=1)
        sub.pull_into(dict(dst.named_parameters()))
        assert dst.weight.requires_grad and torch.equal(dst.weight, src.weight)

    def test_module_pulled_again_and_again_keeps_its_tensors_and_views_keep_their_bytes(self, env):
        """A module may take the received bytes as its own (TCP swaps instead of copying): the same
        parameter objects get each new version; a view taken before sees the new bytes where they are
        copied in place, and keeps its version's bytes where they were swapped (that memory is never
        received into while the view holds it); a corrupt version leaves the module untouched."""
        pub, sub = env
        dst = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.LayerNorm(512)).to(self.device)
        params = {k: id(v) for k, v in dst.named_parameters()}
        versions = {}
        for v in (1, 2, 3):
            src = torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.LayerNorm(512)).to(self.device)
            versions[v] = {k: t.detach().clone() for k, t in src.state_dict().items()}
            pub.publish(src.state_dict(), version=v)
            assert sub.pull_into(dst, min_version=v) == v
            for k, t in dst.state_dict().items():
                assert torch.equal(t, versions[v][k]), (v, k)
            if v == 1:
                held = dst[0].weight.detach()  # aliases whatever memory the module uses now
        swapped = self.transport == "tcp"
        assert torch.equal(held, versions[1 if swapped else 3]["0.weight"])
        assert {k: id(v) for k, v in dst.named_parameters()} == params and dst[0].weight.requires_grad
        pub.publish({k: t + 1 for k, t in versions[3].items()}, version=4)
        self.corrupt(pub, 4, "1.bias")
        with pytest.raises(WeightSyncError, match="checksum"):
            sub.pull_into(dst, min_version=4, timeout=5)
        assert all(torch.equal(t, versions[3][k]) for k, t in dst.state_dict().items())

    def test_follows_a_restarted_publisher(self, transport_setup):
        d = LocalKV()
        name = f"restart-{self.transport}"
        pub = Publisher(name, directory=d)
        pub.publish({"w": torch.ones(3, device=self.device)}, version=1)
        sub = Subscriber(name, self.transport, directory=d)
        assert sub.pull()[1] == 1
        pub.close()  # e.g. the trainer proc was restarted and resumes from its checkpoint
        pub = Publisher(name, directory=d)
        try:
            pub.publish({"w": torch.full((3,), 5.0, device=self.device)}, version=5)
            out, v = sub.pull(min_version=5, timeout=10)
            assert v == 5 and out["w"][0].item() == 5.0
        finally:
            sub.close()
            pub.close()
