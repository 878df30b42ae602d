"""`telemetry.export=tensorboard`: the event files, read back with TensorBoard's own reader, hold
exactly the SQL rows (CleanRL names, env steps as the step)."""

import json
import time

import pytest

import rlmesh.telemetry as tm
from rlmesh.telemetry.config import TelemetryConfig, TelemetryConfigError

pytest.importorskip("tensorboard")


def _read_scalars(logdir):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(logdir), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_tensorboard_export_matches_the_sql_rows(runs_dir):
    from rlmesh.telemetry.api import current_run_dir
    from rlmesh.telemetry.export import TB_DIR, start_export

    run_id = tm.start_run()
    exporter = start_export(["tensorboard"], current_run_dir(), run_id, interval_s=0.05)
    now = time.time()
    for i in range(30):
        tm.record("rollouts", rollout_id=f"r{i}", reward=None if i % 5 == 0 else float(i), length=16,
                  episodes=0 if i % 5 == 0 else 1, policy_version=i // 3, ts=now + i * 0.1)
        if i % 3 == 2:
            v = i // 3 + 1
            tm.record("train_steps", step=v, policy_version=v, loss=1.0 / v, lr=3e-4, samples=48, duration_s=0.02,
                      metrics=json.dumps({"losses/policy_loss": -0.01 * v, "losses/approx_kl": 0.001 * v}))
        if i % 10 == 9:
            tm.record("evals", step=i // 3, policy_version=i // 3, metric="mean_return", value=float(i * 2),
                      episodes=3, env_steps=48 * (i // 3 + 1))
        if i == 15:
            tm.flush()
            time.sleep(0.2)  # let the exporter take a first batch mid-run: the cursor must not skip or repeat
    tm.flush()
    exporter.stop()
    got = _read_scalars(current_run_dir() / TB_DIR)

    q = lambda sql: [tuple(r.values()) for r in tm.query(sql).to_pylist()]  # noqa: E731
    assert got["eval/mean_return"] == [(s, pytest.approx(v)) for s, v in
                                       q("SELECT env_steps, value FROM evals ORDER BY rowid")]
    expect_ret = q("SELECT CAST(sum(length) OVER (ORDER BY rowid) AS BIGINT) AS s, reward FROM rollouts "
                   "QUALIFY reward IS NOT NULL ORDER BY rowid")
    assert got["charts/episodic_return"] == [(s, pytest.approx(v)) for s, v in expect_ret]
    assert len(got["charts/SPS"]) == 30 and all(v > 0 for _, v in got["charts/SPS"])
    expect_pl = q("SELECT CAST(sum(samples) OVER (ORDER BY rowid) AS BIGINT), "
                  "CAST(json_extract_string(metrics, '$.\"losses/policy_loss\"') AS DOUBLE) FROM train_steps "
                  "ORDER BY rowid")
    assert got["losses/policy_loss"] == [(s, pytest.approx(v)) for s, v in expect_pl]
    assert [v for _, v in got["losses/loss"]] == pytest.approx([r[0] for r in q(
        "SELECT loss FROM train_steps ORDER BY rowid")])
    assert {"charts/learning_rate", "losses/approx_kl", "perf/train_step_s"} <= set(got)
    tm.end_run()


def test_export_setting_is_checked(monkeypatch):
    assert TelemetryConfig(export="tensorboard").export_targets() == ["tensorboard"]
    assert TelemetryConfig().export_targets() == []
    with pytest.raises(TelemetryConfigError, match="telemetry.export='tensorbord'.*tensorboard"):
        TelemetryConfig(export="tensorbord")
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(TelemetryConfigError, match="needs wandb, which is not installed: pip install wandb"):
        TelemetryConfig(export="tensorboard,wandb")


def _wandb_history(path):
    """History rows of an offline ``.wandb`` file: LevelDB-log framing (32 KiB blocks, 7-byte record headers)
    after a 7-byte ``:W&B`` header, each record a ``wandb_internal_pb2.Record``."""
    import struct

    from wandb.proto import wandb_internal_pb2 as pb

    data = path.read_bytes()
    assert data[:4] == b":W&B"
    pos, records, buf = 7, [], b""
    while pos + 7 <= len(data):
        left = 32768 - pos % 32768
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if length == 0 and kind == 0:
            pos += left
            continue
        if pos + 7 + length > len(data):
            break  # wandb's service is still writing this record: the caller reads the file again
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            records.append(chunk)
        elif kind == 2:
            buf = chunk
        elif kind == 3:
            buf += chunk
        elif kind == 4:
            records.append(buf + chunk)
    rows = []
    for raw in records:
        rec = pb.Record()
        rec.ParseFromString(raw)
        if rec.WhichOneof("record_type") == "history":
            rows.append({i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item})
    return rows


@pytest.mark.timeout(300)
def test_wandb_export_offline_matches_the_sql_rows(runs_dir, monkeypatch):
    pytest.importorskip("wandb", reason="wandb is in the dev extra: bash scripts/setup.sh installs it")
    from rlmesh.telemetry.api import current_run_dir
    from rlmesh.telemetry.export import start_export

    monkeypatch.setenv("WANDB_MODE", "offline")  # no network, no account
    monkeypatch.setenv("WANDB_SILENT", "true")
    run_id = tm.start_run()
    exporter = start_export(["wandb"], current_run_dir(), run_id, interval_s=0.1)
    for i in range(8):
        tm.record("evals", step=i, policy_version=i, metric="mean_return", value=float(i * 10), episodes=3,
                  env_steps=100 * i)
        tm.record("train_steps", step=i + 1, policy_version=i + 1, loss=1.0 / (i + 1), samples=100,
                  metrics=json.dumps({"losses/policy_loss": -0.1 * i}))
    tm.flush()
    exporter.stop()
    (path,) = (current_run_dir() / "wandb").glob("offline-run-*/run-*.wandb")
    deadline = time.monotonic() + 180  # wandb's own service process writes the file (slowly on a busy host)
    while len(rows := _wandb_history(path)) < 16 and time.monotonic() < deadline:
        time.sleep(0.2)
    got = lambda tag: [(r["global_step"], r[tag]) for r in rows if tag in r]  # noqa: E731
    q = lambda sql: [tuple(r.values()) for r in tm.query(sql).to_pylist()]  # noqa: E731
    assert got("eval/mean_return") == [(s, pytest.approx(v)) for s, v in
                                       q("SELECT env_steps, value FROM evals ORDER BY rowid")]
    assert got("losses/policy_loss") == [(100 * (i + 1), pytest.approx(-0.1 * i)) for i in range(8)]
    tm.end_run()
