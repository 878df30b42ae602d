import time

import pytest

from rlmesh.telemetry.gpu import GpuSampler
from rlmesh.telemetry.health import HealthSampler, ProcessTree, host_sample


def test_host_sample_reads_real_values():
    import psutil

    row = host_sample(ProcessTree(psutil.Process()))
    assert row["mem_total"] > 0 and row["rss"] > 0 and row["load_1m"] is not None


def test_process_tree_keeps_its_list_until_the_refresh_and_drops_the_dead_at_once():
    import subprocess
    import sys

    import psutil

    def child() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])

    a = child()
    b = None
    try:
        kept = ProcessTree(psutil.Process(), refresh_s=3600)
        fresh = ProcessTree(psutil.Process(), refresh_s=0)
        assert kept.rss() > psutil.Process().memory_info().rss  # the child's memory counts too
        assert a.pid in kept.pids
        b = child()
        kept.rss()
        assert b.pid not in kept.pids  # listed again only after refresh_s (the scan costs)
        fresh.rss()
        assert b.pid in fresh.pids
        a.kill()
        a.wait()
        kept.rss()
        assert a.pid not in kept.pids  # an exited process drops out at the next sample
    finally:
        for p in (a, b):
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()


def test_one_sampler_per_host_and_takeover(tmp_path):
    got: list[tuple[str, str]] = []
    a = HealthSampler(lambda t, r: got.append(("a", t)), "unit-election", interval=0.05, gpus=False).start()
    time.sleep(0.3)
    b = HealthSampler(lambda t, r: got.append(("b", t)), "unit-election", interval=0.05, gpus=False).start()
    try:
        time.sleep(0.4)
        assert a.is_sampler and not b.is_sampler
        assert {who for who, table in got if table == "host_health"} == {"a"}
        a.stop()  # releases the lock: b takes over within RETRY_LOCK_S
        deadline = time.time() + 6
        while not b.is_sampler and time.time() < deadline:
            time.sleep(0.05)
        assert b.is_sampler
    finally:
        a.stop()
        b.stop(unlink=True)


def _has_gpu() -> bool:
    return GpuSampler().available


@pytest.mark.skipif(_has_gpu(), reason="this host has an NVIDIA GPU")
def test_no_gpu_means_no_rows():
    s = GpuSampler()
    assert not s.available and s.why_unavailable
    assert s.sample() == []


@pytest.mark.gpu
@pytest.mark.skipif(not _has_gpu(), reason="needs an NVIDIA GPU and driver")
def test_gpu_rows_have_real_readings():
    s = GpuSampler()
    rows = s.sample()
    s.close()
    assert rows and rows[0]["mem_total"] > 0 and rows[0]["uuid"]
