"""proc_health: the unbounded-growth verdict (pure logic, synthetic samples) and a real sample of this process."""

import math
import random

import psutil
import pytest

from rlmesh.telemetry.proc_health import MB, GrowthPolicy, ProcSampler, RssGrowthWatch, slope

POLICY = GrowthPolicy(window_s=300, min_growth_bytes=512 * MB, min_ratio=0.5)


def feed(watch: RssGrowthWatch, rss_at, until_s: float, every_s: float = 5.0, jitter_s: float = 0.0,
         seed: int = 0) -> list:
    """Samples of ``rss_at(t)`` every ``every_s`` (plus up to ``jitter_s`` late, as on a busy host); the verdicts."""
    rng = random.Random(seed)
    out, t = [], 0.0
    while t <= until_s:
        g = watch.add(t, int(rss_at(t)))
        if g is not None:
            out.append((t, g))
        t += every_s + rng.uniform(0, jitter_s)
    return out


def test_slope_is_least_squares():
    assert slope([0, 1, 2, 3], [1, 3, 5, 7]) == pytest.approx(2.0)
    assert slope([5, 5], [1, 9]) == 0.0


def test_a_steady_leak_warns_once_the_window_is_full():
    leak = lambda t: 600 * MB + 45 * MB * t / 1.5  # noqa: E731 - the issue's generator: 45 MB a 1.5 s step
    verdicts = feed(RssGrowthWatch(POLICY), leak, until_s=400)
    assert verdicts, "a 30 MB/s leak went unnoticed"
    t, g = verdicts[0]
    assert 300 <= t < 310  # not before the window is full, and at once after
    assert g.slope_bytes_per_s == pytest.approx(30 * MB, rel=0.01)
    assert g.end_rss > 2 * g.start_rss and "MB/min" in g.describe()


def test_after_a_warning_only_a_doubling_warns_again():
    leak = lambda t: 600 * MB + 30 * MB * t  # noqa: E731 - the issue's leak, for 20 minutes (36 GB)
    verdicts = feed(RssGrowthWatch(POLICY), leak, until_s=1200)
    levels = [g.end_rss for _, g in verdicts]
    assert 2 <= len(levels) <= 4, levels  # a handful of lines, not one per sample (240 samples)
    assert all(b >= 2 * a for a, b in zip(levels, levels[1:]))


@pytest.mark.parametrize("name,rss_at", [
    ("flat with noise", lambda t: 800 * MB + 30 * MB * math.sin(t / 7.0)),
    ("one model load, then flat", lambda t: 200 * MB if t < 60 else 2_000 * MB),
    ("load in the middle of the window", lambda t: 300 * MB if t < 500 else 3_000 * MB),
    ("a buffer that fills, then stays", lambda t: 300 * MB + 2 * MB * min(t, 150)),
    ("slow growth of a big proc", lambda t: 8_000 * MB + 0.5 * MB * t),
    ("sawtooth: grows and is freed", lambda t: 400 * MB + 10 * MB * (t % 120)),
    ("shrinking", lambda t: 3_000 * MB - 2 * MB * min(t, 1000)),
])
def test_bounded_shapes_never_warn(name, rss_at):
    assert feed(RssGrowthWatch(POLICY), rss_at, until_s=3600) == [], name


def test_a_late_sampler_on_a_busy_host_does_not_warn_falsely_or_miss_a_leak():
    """Samples 5-20 s apart (a starved thread): the flat proc stays quiet, the leak is still found."""
    flat = lambda t: 700 * MB + 20 * MB * math.sin(t / 13.0)  # noqa: E731
    assert feed(RssGrowthWatch(POLICY), flat, until_s=3600, jitter_s=15, seed=1) == []
    leak = lambda t: 500 * MB + 5 * MB * t  # noqa: E731
    assert feed(RssGrowthWatch(POLICY), leak, until_s=900, jitter_s=15, seed=2)


def test_too_few_samples_or_a_long_gap_give_no_verdict():
    w = RssGrowthWatch(POLICY)
    assert w.add(0, 100 * MB) is None
    assert w.add(400, 5_000 * MB) is None  # two samples 400 s apart: a gap, not a trend
    w2 = RssGrowthWatch(POLICY)
    for t in (0, 5, 10, 15, 20, 25, 30, 35):
        w2.add(t, 100 * MB)
    for t in range(290, 340, 5):  # nothing in between: the middle quarters are empty
        assert w2.add(t, (t - 200) * 100 * MB) is None


def test_policy_from_env(monkeypatch):
    monkeypatch.setenv("RLMESH_RSS_GROWTH_WINDOW_S", "60")
    monkeypatch.setenv("RLMESH_RSS_GROWTH_MIN_MB", "64")
    monkeypatch.setenv("RLMESH_RSS_GROWTH_RATIO", "not a number")
    p = GrowthPolicy.from_env()
    assert (p.window_s, p.min_growth_bytes, p.min_ratio) == (60.0, 64 * MB, GrowthPolicy().min_ratio)


def test_a_real_sample_of_this_process():
    s = ProcSampler(policy=POLICY).sample(0.0)
    me = psutil.Process()
    assert s.pid == me.pid and s.rss > 10 * MB and s.vms >= s.rss
    assert s.threads >= 1 and s.fds is not None and s.fds > 0 and s.cpu_pct >= 0
    assert s.warning is None
    assert set(s.row()) == {"pid", "rss", "vms", "cpu_pct", "threads", "fds", "warning"}
