"""The chart specs shared by the dashboard and `rlmesh plot`: gap breaking, series shaping, and every
spec's SQL on a real (in-process) run, empty and filled."""

import json
import time

import pyarrow as pa
import pytest

import rlmesh.telemetry as tm
from rlmesh.telemetry import api, charts


def test_lines_break_at_stalls_but_not_at_ordinary_steps():
    t = [0.0, 1.0, 2.0, 3.0, 60.0, 61.0]  # a 57 s stall between the 4th and 5th points
    x, y = charts.break_at_gaps([0, 10, 20, 30, 40, 50], [1, 2, 3, 4, 5, 6], t)
    assert x == [0, 10, 20, 30, None, 40, 50] and y == [1, 2, 3, 4, None, 5, 6]
    x2, _ = charts.break_at_gaps([0, 10, 20], [1, 2, 3], [0.0, 1.0, 2.5])  # irregular, no stall
    assert None not in x2


def test_short_gaps_never_break_a_fast_curve():
    t = [i * 0.01 for i in range(10)] + [0.5]  # 0.41 s jump: 41x the median, but under MIN_GAP_S
    x, _ = charts.break_at_gaps(list(range(11)), list(range(11)), t)
    assert None not in x


def test_series_column_splits_rows_and_value_columns_name_series():
    spec = charts.ChartSpec("c", "c", "", "x", "y")
    tbl = pa.table({"x": [1, 2, 1], "y": [1.0, 2.0, 3.0], "series": ["a", "a", "b"]})
    names = [(s.name, s.x, s.y) for s in charts.to_chart(spec, tbl).series]
    assert names == [("a", [1, 2], [1.0, 2.0]), ("b", [1], [3.0])]
    wide = pa.table({"x": [1, 2], "loss": [0.5, None], "kl": [0.1, 0.2]})
    out = {s.name: (s.x, s.y) for s in charts.to_chart(spec, wide).series}
    assert out == {"loss": ([1], [0.5]), "kl": ([1, 2], [0.1, 0.2])}  # NULL values are skipped, not zero


def test_every_chart_runs_on_an_empty_run(runs_dir, monkeypatch):
    monkeypatch.setenv("RLMESH_HEALTH_INTERVAL", "0")  # no host_health rows either
    tm.start_run()
    for spec in charts.CHARTS:
        data = charts.evaluate(spec, tm.query)
        assert all(not s.x for s in data.series), spec.id
    tm.end_run()


def test_charts_read_the_rows_a_run_recorded(runs_dir):
    now = time.time()
    for i in range(40):
        tm.record("rollouts", rollout_id=f"r{i}", reward=float(i), length=10, episodes=1, policy_version=i // 4,
                  ts=now + i)
    for v in range(1, 11):
        tm.record("train_steps", step=v, policy_version=v, loss=1.0 / v, samples=40, duration_s=0.01,
                  metrics=json.dumps({"losses/policy_loss": -0.1 * v}), ts=now + 4 * v)
        tm.record("evals", step=v, policy_version=v, metric="mean_return", value=10.0 * v, episodes=3,
                  env_steps=40 * v, ts=now + 4 * v)
    api.recorder().record_trusted("actors", {"event": "died", "proc": "rl.2", "mesh": "rl", "rank": 2, "ts": now + 20})
    tm.flush()
    get = lambda cid: charts.evaluate(charts.BY_ID[cid], tm.query)  # noqa: E731
    ev = get("eval_env_steps").series
    assert [s.name for s in ev] == ["mean_return"] and ev[0].x == [40 * v for v in range(1, 11)]
    rew = get("reward_env_steps").series[0]
    assert rew.x[-1] == 400 and rew.y[0] == 0.0 and rew.y[-1] == 39.0  # env steps = cumulative rollout lengths
    loss = {s.name: s for s in get("loss_env_steps").series}
    assert loss["loss"].x == [40 * v for v in range(1, 11)] and loss["policy_loss"].y[-1] == pytest.approx(-1.0)
    assert get("reward_version").series[0].x == list(range(10))
    stale = get("staleness").series[0]
    assert sum(stale.y) == 40  # every rollout counted once, by its lag
    (death,) = charts.evaluate(charts.DEATHS, tm.query).series
    assert death.x == [210]  # env steps generated up to the death (21 rollouts of 10)
    tm.end_run()


def test_a_chart_over_a_table_an_old_run_lacks_is_empty_and_other_errors_still_raise():
    import duckdb
    import pytest

    con = duckdb.connect()  # a run file from before proc_health existed: no such table
    query = lambda sql: con.execute(sql.replace("{t0_us}", "0").replace("{t0}", "0")).arrow()  # noqa: E731
    data = charts.evaluate(charts.BY_ID["proc_rss"], query)
    assert data.rows == 0 and data.series == []
    with pytest.raises(duckdb.Error):
        charts.evaluate(charts.ChartSpec("bad", "bad", "SELECT no_such_column FROM (SELECT 1 AS x)", "x", "y"), query)
