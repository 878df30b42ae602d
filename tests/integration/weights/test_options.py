"""Publisher options and the errors that name the fix."""

import pytest
import torch

from rlmesh.actor.kv import LocalKV
from rlmesh.weights import Publisher, Subscriber, TransportUnavailableError, WeightSyncError
from rlmesh.weights import assemble

pytestmark = pytest.mark.timeout(30)


def test_bad_options_are_refused_with_the_valid_ones():
    with pytest.raises(ValueError, match="keep must be >= 1"):
        Publisher("opt", keep=0, directory=LocalKV())
    with pytest.raises(ValueError, match=r"choose from \['shm', 'tcp', 'rdma', 'cuda-ipc'\]"):
        Publisher("opt", transports=("shm", "udp"), directory=LocalKV())
    with pytest.raises(ValueError, match="not one of"):
        Subscriber("opt", "carrier-pigeon", directory=LocalKV())


def test_shm_only_publisher_serves_no_network_readers():
    d = LocalKV()
    with Publisher("opt-shm", transports=("shm",), directory=d) as pub:
        pub.publish({"w": torch.ones(2)}, version=1)
        assert pub.record()["tcp"] is None
        assert Subscriber("opt-shm", directory=d).pull()[1].stats.transport == "shm"
        with pytest.raises(TransportUnavailableError, match="without 'tcp'"):
            Subscriber("opt-shm", "tcp", directory=d).pull(timeout=1)


def test_keep_one_still_never_overwrites_a_held_version():
    d = LocalKV()
    with Publisher("opt-keep1", keep=1, directory=d) as pub:
        pub.publish({"w": torch.full((1000,), 1.0)}, version=1)
        sub = Subscriber("opt-keep1", "shm", directory=d)
        held = sub._transport(False, 5).fetch(1, None, 5)
        try:
            pub.publish({"w": torch.full((1000,), 2.0)}, version=2)
            assert pub.versions() == [2] and len(pub.pool.slots) == 2  # a second slot instead of waiting
            assemble.verify(held.manifest, held.sources)
        finally:
            held.release()
        pub.publish({"w": torch.full((1000,), 3.0)}, version=3)  # now the first slot is free again
        assert len(pub.pool.slots) == 2 and sub.pull()[0]["w"][0].item() == 3.0


def test_missing_publisher_times_out_with_the_fix():
    with pytest.raises(WeightSyncError, match=r"create rm.weights.Publisher\('nobody'\)"):
        Subscriber("nobody", directory=LocalKV(), timeout=0.2).pull(timeout=0.2)
