"""Agentic rollouts with real procs: isolated tools under limits, environments in their own mesh,
an env proc SIGKILLed mid-episode (the work item re-issued under the same id), a hanging tool,
and the ``turns`` table with the queries of docs/agentic.md."""

from __future__ import annotations

import glob
import os
import re
import signal
import socket
import time
import uuid
from pathlib import Path

import pytest
import torch

import rlmesh as rm
from _support.waiting import wait_for
from agentic_tools import GatedCalculatorEnv, HangingToolEnv, ScriptedEnv, boom, connect, crash, hang, hog, where
from rlmesh.rl.actors import ReplayBuffer
from rlmesh.rl.actors.llm_generator import backend_kwargs_for
from rlmesh.rl.agentic.calculator import MulProblem, MultiplicationTask
from rlmesh.rl.agentic.config import AgenticGeneratorConfig
from rlmesh.rl.agentic.env_actor import EnvActor, MeshEnvClient
from rlmesh.rl.agentic.generator import AgenticGenerator
from rlmesh.rl.agentic.tools import Tool, ToolError, ToolLimits, run_tool
from rlmesh.rl.agentic.training import sft_on_demonstrations
from rlmesh.rl.config import BufferConfig
from rlmesh.rl.models.transformer import Transformer, TransformerConfig
from rlmesh.rl.run.schedule import WorkItem

TASK = MultiplicationTask(2, 2)
GEN = AgenticGeneratorConfig(samples_per_prompt=2, max_new_tokens=8, max_turns=3,
                             max_episode_tokens=TASK.max_episode_tokens(), partial_rollouts=False)
MODEL = TransformerConfig(vocab_size=TASK.tokenizer.vocab_size, max_seq_len=TASK.max_prompt_len() + GEN.max_episode_tokens,
                          d_model=32, n_layers=1, n_heads=2)
DOC = Path(__file__).resolve().parents[3] / "docs" / "agentic.md"


@pytest.mark.timeout(120)
def test_isolated_tools_hang_crash_memory_network_scratch():
    lim = ToolLimits(timeout_s=1.0, memory_mb=128)
    t0 = time.monotonic()
    r = run_tool(Tool("hang", hang), "", lim)
    assert r.error.startswith(ToolError.TIMEOUT) and "killed" in r.error
    assert time.monotonic() - t0 < 30  # gross bound: the 1 s limit, not the tool's hour
    r = run_tool(Tool("crash", crash), "", ToolLimits(timeout_s=30))
    assert r.error.startswith(ToolError.CRASHED) and "SIGKILL" in r.error
    r = run_tool(Tool("hog", hog), "", ToolLimits(timeout_s=30, memory_mb=128))
    assert r.error.startswith(ToolError.MEMORY), r.error
    r = run_tool(Tool("boom", boom), "x", ToolLimits(timeout_s=30))
    assert r.error.startswith(ToolError.EXCEPTION) and "bad input x" in r.error
    r = run_tool(Tool("where", where), "", ToolLimits(timeout_s=30))
    assert r.error is None and "rlmesh-tool-where-" in r.output and not os.path.exists(r.output)  # scratch, removed
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        port = str(server.getsockname()[1])
        r = run_tool(Tool("net", connect), port, ToolLimits(timeout_s=30, network=True))
        assert r.output == "connected", r.error
        r = run_tool(Tool("net", connect), port, ToolLimits(timeout_s=30))
        assert r.error is not None and r.output == ""


@pytest.mark.timeout(120)
def test_hanging_tool_gives_an_error_observation_and_the_env_keeps_serving():
    with rm.this_host().spawn_procs(per_host={"procs": 1}) as procs:
        env = MeshEnvClient(procs.spawn("env_hang", EnvActor, HangingToolEnv))
        assert env.reset("e1", MulProblem("12*34=", "408")).result(60) == "12*34="
        t0 = time.monotonic()
        hung = env.step("e1", "[12*34]")
        env.reset("e2", MulProblem("11*11=", "121")).result(60)  # served while e1's tool hangs
        r = hung.result(60)
        assert time.monotonic() - t0 < 30
        assert r.observation == "(?)" and not r.done and r.tool.error.startswith(ToolError.TIMEOUT)
        final = env.step("e1", "408").result(60)
        assert final.done and final.reward == 1.0


def _spawn(procs, tag: str, env_cls, env_kwargs: dict, weights: str):
    buffer = procs.slice(procs=0).spawn(f"buf_{tag}", ReplayBuffer, BufferConfig(max_policy_lag=0))
    env = procs.slice(procs=1).spawn(f"env_{tag}", EnvActor, env_cls, env_kwargs)
    gen = procs.slice(procs=0).spawn(f"gen_{tag}", AgenticGenerator, GEN, TASK, buffer, env,
                                     backend_kwargs_for("torch", TASK, MODEL), weights=weights)
    return buffer, env, gen


@pytest.mark.timeout(180)
def test_env_proc_sigkilled_mid_episode_reissues_the_work_item_once(tmp_path):
    name = f"policy-{uuid.uuid4().hex[:6]}"
    gate = tmp_path / "gate"
    gate.touch()
    torch.manual_seed(0)
    problems = TASK.sample(2, __import__("random").Random(0))
    with rm.this_host().spawn_procs(per_host={"procs": 2}, restart=rm.Restart(max_restarts=1)) as procs:
        pub = rm.weights.Publisher(name)  # after the procs: the publisher registers where they look
        pub.publish(Transformer(MODEL).state_dict(), version=0)
        buffer, env, gen = _spawn(procs, "kill", GatedCalculatorEnv, {"gate": str(gate)}, name)
        item = WorkItem("agentic-k", 0, 0)
        pending = gen.generate.call_one(item, problems)
        def stepping() -> bool:
            if pending.done():  # failed before the kill: show why
                pending.get()
            return len(glob.glob(f"{gate}.*")) == 4

        wait_for(stepping, 60.0, "4 episodes waiting inside a step")
        os.kill(procs.pids[1], signal.SIGKILL)
        with pytest.raises(rm.ActorDied) as died:
            pending.get(timeout=120)
        assert died.value.mesh == "env_kill"
        procs.wait_alive(timeout=90)
        gate.unlink()
        again = gen.generate.call_one(item, problems).get(timeout=120)  # what serve_work does: same id
        assert again["accepted"] and again["rollout_id"] == "agentic-k" and again["samples"] == 4
        stats = buffer.stats.call_one().get()
        assert stats["buffer/added"] == 1 and stats["buffer/dropped_duplicate"] == 0
        pub.close()


@pytest.fixture(scope="module")
def tool_run():
    """A generator that calls tools (a briefly warm-started model), two work items, rows in telemetry."""
    name = f"policy-{uuid.uuid4().hex[:6]}"
    prefix = f"turns-{uuid.uuid4().hex[:6]}"
    with rm.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        # a brief warm start on tool-call demonstrations, so the episodes call the calculator
        torch.manual_seed(0)
        model = Transformer(MODEL)
        sft_on_demonstrations(model, TASK, 40, tool_fraction=1.0, batch_size=32, lr=3e-3)
        pub = rm.weights.Publisher(name)
        pub.publish(model.state_dict(), version=0)
        buffer, env, gen = _spawn(procs, "turns", ScriptedEnv, {}, name)
        results = [gen.generate.call_one(WorkItem(f"{prefix}-{i}", 0, i), TASK.sample(4, __import__("random").Random(i)))
                   .get(timeout=120) for i in range(2)]
        rows = wait_for(lambda: rm.telemetry.query(
            f"SELECT count(DISTINCT rollout_id) AS n FROM turns WHERE rollout_id LIKE '{prefix}%'").to_pylist()[0]["n"]
            == 16 or None, 60.0, "turns rows of 16 episodes")
        assert rows
        pub.close()
    return prefix, results


@pytest.mark.timeout(240)
def test_turns_table_records_every_turn(tool_run):
    prefix, results = tool_run
    turns = sum(r["turns"] for r in results)
    rows = rm.telemetry.query(f"SELECT * FROM turns WHERE rollout_id LIKE '{prefix}%' ORDER BY rollout_id, turn").to_pylist()
    assert len(rows) == turns
    calls = [r for r in rows if r["tool"] == "calculator"]
    assert calls, "the warm-started model called no tool"
    for r in calls:
        assert r["tool_latency_s"] is not None and r["tool_latency_s"] >= 0 and len(r["args"]) <= 200
        assert r["reward"] == pytest.approx(0.25) and r["policy_version"] == 0
    ends = [r for r in rows if r["ended"] is not None]
    assert len(ends) == 16 and all(r["ended"] in ("done", "max_turns", "max_tokens") for r in ends)
    # per-turn rewards sum to the episode's reward in the rollouts table
    per_ep = rm.telemetry.query(
        f"SELECT t.rollout_id, sum(t.reward) AS s, any_value(r.reward) AS r FROM turns t JOIN rollouts r USING (rollout_id) "
        f"WHERE t.rollout_id LIKE '{prefix}%' GROUP BY 1").to_pylist()
    assert len(per_ep) == 16 and all(abs(x["s"] - x["r"]) < 1e-9 for x in per_ep)


@pytest.mark.timeout(240)
def test_docs_agentic_queries_run(tool_run):
    queries = re.findall(r"```sql\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(queries) >= 5
    for q in queries:
        rows = rm.telemetry.query(q).to_pylist()
        assert rows, f"no rows from docs/agentic.md query:\n{q}"


@pytest.mark.timeout(120)
def test_docs_one_file_tool_env_runs(tmp_path, monkeypatch):
    """The one-file environment of docs/agentic.md, imported as a module (its tool runs isolated)."""
    code = next(b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S) if "class CodeEnv" in b)
    (tmp_path / "doc_code_env.py").write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    mod = __import__("doc_code_env")
    env = mod.CodeEnv()
    env.reset(MulProblem("6*7=", "42"))
    r = env.step("<py>result = 6*7</>")
    assert (r.observation, r.done, r.tool.tool, r.tool.error) == ("42", False, "python", None)
    r = env.step("<py>while True: pass</>")
    assert r.observation == "error" and r.tool.error.startswith(ToolError.TIMEOUT)
    assert env.step("42").reward == 1.0
