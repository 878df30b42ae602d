"""docs/telemetry.md is tested: its SQL runs, and it documents every built-in column."""

import os
import re
import time
from pathlib import Path

import pytest

import rlmesh.telemetry as tm
from rlmesh.telemetry import api, schema

DOC = Path(__file__).resolve().parents[3] / "docs" / "telemetry.md"
QUERIES = re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)
MAY_BE_EMPTY = ("FROM gpu_health GROUP BY", "FROM _rejected", "FROM logs l", "FROM stacks")  # logs/stacks: run on real procs by tests/integration/observe


def test_doc_has_ten_queries():
    assert len(QUERIES) >= 10


def test_doc_documents_every_builtin_column():
    text = DOC.read_text()
    for t in schema.DOCUMENTED.values():
        section = text.split(f"### `{t.name}`", 1)
        assert len(section) == 2, f"no section for {t.name}"
        body = section[1].split("\n### ", 1)[0]
        for c in t.columns:
            assert f"| `{c.name}` | {c.type} |" in body, f"{t.name}.{c.name} undocumented"
    for c in schema.AUTO:
        assert f"| `{c.name}` | {c.type} |" in text


def _populate() -> float:
    """A small run shaped like an RL job: 3 generators, gen.1 killed and restarted, then its rewards collapse."""
    rec = api.recorder()
    t0 = time.time() - 60
    for i in range(3):
        rec.record_trusted("actors", {"mesh": "gen", "rank": i, "proc": f"gen.{i}", "event": "spawned",
                                      "incarnation": 0, "pid": 100 + i}, ts=t0)
    for step in range(10):
        tm.record("train_steps", ts=t0 + step * 5, step=step, policy_version=step, loss=1 / (step + 1),
                  lr=3e-4, grad_norm=0.5, samples=64)
        for r in range(2):
            tm.record("train_ranks", ts=t0 + step * 5, mesh="trainer", rank=r, step=step, ranks=2, policy_version=step,
                      step_s=0.5, sample_s=0.1 * (r == 0), handoff_s=0.01, train_step_s=0.4, forward_s=0.1,
                      backward_s=0.25, optimizer_s=0.05, sync_s=0.01, publish_s=0.05, publish_bytes=(r == 0) << 20,
                      checkpoint_s=0.0, param_bytes=1 << 19, optim_bytes=1 << 20, rss_peak_bytes=1 << 28)
        for g in range(3):
            tm.record("weight_syncs", ts=t0 + step * 5 + 0.1, name="policy", version=step, transport="shm",
                      bytes=1 << 20, duration_s=0.002, ok=True, proc=f"gen.{g}")
    for k in range(60):
        for g in range(3):
            collapsed = g == 1 and k >= 40
            tm.record("rollouts", ts=t0 + k * 0.8 + 0.3, proc=f"gen.{g}", mesh="gen", rank=g,
                      rollout_id=f"{g}-{k}", policy_version=max(0, int(k * 0.8 / 5) - 1),
                      reward=0.0 if collapsed else 1.0 + 0.01 * k, length=100, env="gsm8k", duration_s=0.5,
                      source="gsm8k_sample.jsonl", finish_reason="length" if k % 4 == 0 else "stop")
            if k % 10 == 0:
                tm.record("samples", ts=t0 + k * 0.8 + 0.3, proc=f"gen.{g}", mesh="gen", rank=g,
                          rollout_id=f"{g}-{k}", policy_version=max(0, int(k * 0.8 / 5) - 1), prompt="2+2?",
                          completion="4", answer="4", reward=1.0, source="gsm8k_sample.jsonl")
    kill = t0 + 40 * 0.8
    for s in range(3):
        rec.record_trusted("spans", {"mesh": "gen", "rank": 1, "proc": "gen.1", "actor_id": "gen/1",
                                     "endpoint": "generate", "caller": "controller", "start_ts": kill - 5 + s,
                                     "duration_s": 0.2, "outcome": "error", "error": "CUDA error: an illegal memory access",
                                     "bytes_in": 10, "bytes_out": 0, "weight": 1}, ts=kill - 5 + s)
    rec.record_trusted("spans", {"mesh": "gen", "rank": 0, "proc": "gen.0", "actor_id": "gen/0", "endpoint": "generate",
                                 "caller": "controller", "start_ts": kill, "duration_s": 0.1, "outcome": "ok",
                                 "bytes_in": 10, "bytes_out": 100, "weight": 3}, ts=kill)
    rec.record_trusted("actors", {"mesh": "gen", "rank": 1, "proc": "gen.1", "event": "died", "incarnation": 0,
                                  "signal": 9, "pid": 101}, ts=kill - 0.2)
    for ev in ("spawned", "restarted"):
        rec.record_trusted("actors", {"mesh": "gen", "rank": 1, "proc": "gen.1", "event": ev, "incarnation": 1,
                                      "pid": 201}, ts=kill - 0.1)
    for k in range(12):  # a generator whose memory grows, with the warning its health thread gives
        rec.record_trusted("proc_health", {"mesh": "gen", "rank": 0, "proc": "gen.0", "pid": 100, "rss": (600 + 500 * k) << 20,
                                           "vms": 8 << 30, "cpu_pct": 95.0, "threads": 12, "fds": 40,
                                           "warning": "RSS grows without bound" if k == 11 else None}, ts=t0 + 5 * k)
    tm.flush()
    return kill


@pytest.fixture
def doc_run(runs_dir):
    tm.start_run(config={"recipe": "docs"})
    kill = _populate()
    deadline = time.time() + 10  # host_health comes from the real sampler
    while not tm.query("SELECT count(*) AS n FROM host_health").column("n")[0].as_py():
        assert time.time() < deadline, "no host_health rows"
        time.sleep(0.1)
    return kill


def _run_all(run=None):
    results = []
    for sql in QUERIES:
        out = tm.query(sql, run=run)
        if not any(m in sql for m in MAY_BE_EMPTY):
            assert out.num_rows > 0, f"doc query returned no rows:\n{sql}"
        results.append(out)
    return results


def test_doc_queries_run_live_and_after_the_run(doc_run):
    live = _run_all()
    headline = live[1].to_pylist()
    assert headline and {r["proc"] for r in headline} == {"gen.1"}
    assert all(r["incarnation"] == 1 and r["restarted_at"] is not None for r in headline)
    deaths = live[2].to_pylist()
    assert deaths[0]["proc"] == "gen.1" and deaths[0]["signal"] == 9 and deaths[0]["errors_before"] == 3
    run_id = tm.current_run()
    tm.end_run()
    after = _run_all(run=run_id)
    assert [t.num_rows for t in after[:8]] == [t.num_rows for t in live[:8]]


def test_doc_python_snippets_run(runs_dir, monkeypatch):
    from rlmesh.telemetry.config import TelemetryConfig

    for k in TelemetryConfig().env():  # a snippet calls .apply(): restore the environment afterwards
        monkeypatch.setenv(k, os.environ.get(k, "placeholder") if k != "RLMESH_RUNS_DIR" else str(runs_dir))
    monkeypatch.setenv("RLMESH_TELEMETRY", "1")
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    runnable = [b for b in blocks if "not a runnable snippet" not in b]
    assert len(runnable) >= 3
    scope: dict = {}
    for block in runnable:
        exec(compile(block, str(DOC), "exec"), scope)
    assert scope["tbl"].num_rows == 1  # the intro's query over the intro's record
    monkeypatch.setenv("RLMESH_RUNS_DIR", str(runs_dir))
