"""Span sampling: hot endpoints are rate-limited, but sum(weight) still counts every call and errors are kept."""

from rlmesh.actor.hooks import Span
from rlmesh.telemetry.plugin import SpanSampler


class Rows:
    def __init__(self):
        self.rows = []

    def record_trusted(self, table, row, ts=None):
        self.rows.append((table, row))


def span(endpoint="gen", outcome="ok", t=1.0):
    return Span(mesh="m", actor_id="m/0", rank=0, endpoint=endpoint, caller="controller", start_ts=t,
                duration_s=0.001, outcome=outcome, bytes_in=1, bytes_out=2, error="E: x" if outcome == "error" else "")


def test_under_the_limit_every_call_is_a_row():
    r = Rows()
    s = SpanSampler(r, max_per_s=100)
    for _ in range(50):
        s(span())
    assert len(r.rows) == 50 and all(row["weight"] == 1 for _, row in r.rows)
    assert r.rows[0][0] == "spans" and r.rows[0][1]["endpoint"] == "gen"


def test_hot_endpoint_is_sampled_and_weights_carry_the_count(monkeypatch):
    import rlmesh.telemetry.plugin as plugin

    now = [1000.0]
    monkeypatch.setattr(plugin.time, "time", lambda: now[0])
    r = Rows()
    s = SpanSampler(r, max_per_s=10)
    for i in range(100):          # 100 calls in the same second
        s(span(outcome="error" if i == 50 else "ok"))
    now[0] += 1.5                 # next window: the first row carries the skipped calls
    s(span())
    weights = [row["weight"] for _, row in r.rows]
    assert len(r.rows) == 12      # 10 + the error + the next window's first
    assert sum(weights) == 101    # every call counted
    assert any(row["outcome"] == "error" for _, row in r.rows)


def test_endpoints_are_limited_separately():
    r = Rows()
    s = SpanSampler(r, max_per_s=5)
    for _ in range(20):
        s(span("a"))
        s(span("b"))
    assert sum(1 for _, row in r.rows if row["endpoint"] == "a") == 5
    assert sum(1 for _, row in r.rows if row["endpoint"] == "b") == 5
