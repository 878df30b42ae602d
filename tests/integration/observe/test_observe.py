"""Logs, stacks, `rlmesh logs/stacks` and the MCP server against one real run (obs_scenario.py).

The controller is a subprocess; its procs print, log, SIGKILL themselves and hang in C
holding the GIL. Tests run in file order: first against the live run (answered by its
telemetry service), then after it finished (the file, read-only).
"""

import asyncio
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).parent
ROOT = HERE.parents[2]
pytestmark = pytest.mark.timeout(180)
N_LINES = 300


def _env(runs_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("RLMESH_TELEMETRY", "RLMESH_RUN_ID", "RLMESH_SECRET", "RLMESH_WORKER_PLUGINS",
                                "RLMESH_CAPTURE", "RLMESH_ECHO"))}
    env["RLMESH_RUNS_DIR"] = str(runs_dir)
    env["RLMESH_HEALTH_INTERVAL"] = "0"
    # The scenario counts restarts exactly: a loaded VM must not add heartbeat deaths of its own
    # (the hung proc holds the GIL for hours, so it is still caught, 6 s later).
    env["RLMESH_HEARTBEAT_TIMEOUT_S"] = "6"
    env["PYTHONPATH"] = os.pathsep.join([str(HERE), str(ROOT), env.get("PYTHONPATH", "")])
    return env


@pytest.fixture(scope="module")
def runs_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("runs")


@pytest.fixture(scope="module")
def live(runs_dir):
    p = subprocess.Popen([sys.executable, str(HERE / "obs_scenario.py")], env=_env(runs_dir),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    before = []
    for line in p.stdout:  # the echo of workers' stdout comes first, then READY
        if line.startswith("READY"):
            break
        before.append(line)
    else:
        p.kill()
        pytest.fail(f"scenario did not get ready:\n{''.join(before)[-3000:]}\n{p.stderr.read()[-4000:]}")
    run_id = line.split()[1]
    yield p, runs_dir / run_id, before
    if p.poll() is None:
        p.kill()


@pytest.fixture(scope="module")
def finished(live):
    p, run_dir, before = live
    p.stdin.write("go\n")
    p.stdin.flush()
    out, err = p.communicate(timeout=60)
    assert p.returncode == 0, err[-4000:]
    return run_dir, "".join(before) + out, err


def cli(runs_dir: Path, *args: str, ok: bool = True) -> subprocess.CompletedProcess:
    out = subprocess.run([sys.executable, "-m", "rlmesh.cli", *args], env=_env(runs_dir), capture_output=True,
                         text=True, timeout=60)
    if ok:
        assert out.returncode == 0, out.stderr
    return out


def sql(runs_dir: Path, run: str, query: str) -> list[dict]:
    return json.loads(cli(runs_dir, "sql", run, query, "--format", "json").stdout)["rows"]


# ---- live ---------------------------------------------------------------------------------------

def test_sigkilled_proc_lines_written_before_the_kill_are_all_in_logs(live, runs_dir):
    _, run_dir, _ = live
    rows = sql(runs_dir, run_dir.name, "SELECT message FROM logs WHERE proc = 'workers.1' AND incarnation = 0 "
               "AND stream = 'stdout' AND message LIKE 'line %' ORDER BY ts")
    assert [r["message"] for r in rows] == [f"line {i} of {N_LINES}" for i in range(N_LINES)]
    died = sql(runs_dir, run_dir.name, "SELECT signal FROM actors WHERE proc = 'workers.1' AND incarnation = 0 "
               "AND event = 'died'")
    assert died == [{"signal": 9}]


def test_logging_records_carry_level_logger_exception_and_actor(live, runs_dir):
    _, run_dir, _ = live
    rows = sql(runs_dir, run_dir.name, "SELECT mesh, rank, proc, level, logger, message, exception, actor "
               "FROM logs WHERE stream = 'log' AND logger = 'talker' AND level = 'ERROR'")
    assert len(rows) == 1
    r = rows[0]
    assert (r["mesh"], r["rank"], r["proc"], r["message"], r["actor"]) == ("workers", 2, "workers.2", "lookup failed",
                                                                          "talker[2]")
    assert "KeyError: 'missing'" in r["exception"] and "fail_logged" in r["exception"]
    streams = sql(runs_dir, run_dir.name, "SELECT DISTINCT stream FROM logs WHERE message LIKE 'hello from every rank%' "
                  "OR message LIKE 'talker said hello%' ORDER BY 1")
    assert [s["stream"] for s in streams] == ["log", "stderr", "stdout"]
    ctl = sql(runs_dir, run_dir.name, "SELECT count(*) AS n FROM logs WHERE mesh = 'controller' "
              "AND message LIKE 'proc workers[1] died%'")
    assert ctl[0]["n"] == 2  # the controller's own rlmesh warnings are rows too


def test_hung_proc_stacks_were_taken_before_its_kill_and_show_where_it_was_stuck(live, runs_dir):
    _, run_dir, _ = live
    rows = sql(runs_dir, run_dir.name, "SELECT s.function, s.file, s.depth, s.incarnation FROM stacks s "
               "JOIN actors a ON a.proc = s.proc AND a.incarnation = s.incarnation AND a.event = 'died' "
               "WHERE s.proc = 'workers.0' AND s.reason = 'heartbeat timeout' AND a.reason LIKE 'heartbeat%' "
               "AND s.ts <= a.ts + INTERVAL 5 SECOND ORDER BY s.thread, s.depth")
    assert rows, "no stacks stored for the hung proc"
    stuck = [r for r in rows if r["function"] == "stuck_in_regex"]
    assert stuck and stuck[0]["file"].endswith("obs_actors.py") and stuck[0]["incarnation"] == 0
    # the frame above it is the regex engine it was stuck in
    assert any(r["function"] == "match" and r["depth"] == stuck[0]["depth"] - 1 for r in rows)


def test_rlmesh_stacks_dumps_a_live_proc_with_thread_names(live, runs_dir):
    _, run_dir, _ = live
    t0 = time.time()
    doc = json.loads(cli(runs_dir, "stacks", run_dir.name, "--proc", "workers.2", "--format", "json").stdout)
    assert doc["rows"] and {r["proc"] for r in doc["rows"]} == {"workers.2"}
    assert {r["reason"] for r in doc["rows"]} == {"signal"}
    assert len({r["dump_id"] for r in doc["rows"]}) == 1
    names = {r["thread_name"] for r in doc["rows"]}
    assert {"MainThread", "rlmesh-control"} <= names, names
    assert time.time() - t0 < 120  # gross bound against a hang
    text = cli(runs_dir, "stacks", run_dir.name, "--proc", "workers.2").stdout
    assert "== workers.2" in text and "thread" in text and "'MainThread'" in text


def test_rlmesh_logs_filters_by_rank_and_level(live, runs_dir):
    _, run_dir, _ = live
    doc = json.loads(cli(runs_dir, "logs", run_dir.name, "--rank", "1", "--level", "WARNING",
                         "--format", "json").stdout)
    msgs = [r["message"] for r in doc["rows"]]
    assert msgs and all(r["rank"] == 1 and r["level"] in ("WARNING", "ERROR", "CRITICAL") for r in doc["rows"])
    assert "talker said last words of rank 1" in msgs
    text = cli(runs_dir, "logs", run_dir.name, "--mesh", "workers", "--grep", "line 299").stdout
    assert re.search(r"\[workers\[1\]\] line 299 of 300", text)
    bad = cli(runs_dir, "logs", run_dir.name, "--level", "LOUD", ok=False)
    assert bad.returncode == 1 and "DEBUG, INFO, WARNING" in bad.stderr


def _mcp_session(runs_dir: Path, calls, allow_control: bool = False):
    """Run ``calls(session)`` against `rlmesh mcp` started by the SDK's own stdio client."""
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    args = ["-m", "rlmesh.cli", "mcp"] + (["--allow-control"] if allow_control else [])
    params = StdioServerParameters(command=sys.executable, args=args, env=_env(runs_dir))

    async def main():
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                return await calls(s)

    return asyncio.run(asyncio.wait_for(main(), 90))


def test_mcp_answers_which_actor_restarted_most_and_what_it_logged_before_dying(live, runs_dir):
    pytest.importorskip("mcp")
    _, run_dir, _ = live

    async def calls(s):
        tools = {t.name for t in (await s.list_tools()).tools}
        runs = (await s.call_tool("list_runs", {})).structured_content
        run = runs["runs"][-1]["id"]
        status = (await s.call_tool("run_status", {"run": run})).structured_content
        most = max(status["procs"], key=lambda p: p["restarts"])
        # "before dying" = the lines of the incarnation that died, not a time window around the death:
        # the replacement may print within milliseconds of it, and lines are stamped when read
        died_inc = (await s.call_tool("query", {"run": run, "sql": (
            "SELECT incarnation FROM actors WHERE event = 'died' AND proc = '" + most["proc"]
            + "' ORDER BY ts DESC LIMIT 1")}
        )).structured_content["rows"][0]["incarnation"]
        before = (await s.call_tool("logs", {"run": run, "proc": most["proc"], "incarnation": died_inc,
                                             "stream": "stdout", "limit": 1})).structured_content
        refused = await s.call_tool("query", {"run": run, "sql": "DELETE FROM logs"})
        control = await s.call_tool("inject_fault", {"run": run, "proc": most["proc"]})
        capped = (await s.call_tool("query", {"run": run, "sql": "SELECT * FROM logs", "limit": 3})).structured_content
        return tools, run, most, before, refused, control, capped

    tools, run, most, before, refused, control, capped = _mcp_session(runs_dir, calls)
    assert {"list_runs", "schema", "query", "run_status", "logs", "stacks"} <= tools
    assert not {"inject_fault", "stop_run"} & tools  # control tools only with --allow-control
    assert run == run_dir.name
    assert (most["proc"], most["restarts"]) == ("workers.1", 2)
    assert [r["message"] for r in before["rows"]] == ["last words of rank 1"]
    assert refused.is_error and "read-only" in refused.content[0].text
    assert control.is_error
    assert capped["row_count"] == 3 and capped["truncated"] and capped["format_version"] == 1


def test_mcp_schema_and_stacks(live, runs_dir):
    pytest.importorskip("mcp")
    _, run_dir, _ = live

    async def calls(s):
        schema = (await s.call_tool("schema", {"run": run_dir.name})).structured_content
        taken = (await s.call_tool("stacks", {"run": run_dir.name, "proc": "workers.2", "take_now": True}))
        return schema, taken.structured_content

    schema, taken = _mcp_session(runs_dir, calls)
    cols = {c["name"]: c for c in schema["tables"]["logs"]["columns"]}
    assert {"message", "level", "stream", "exception"} <= set(cols) and cols["level"]["description"]
    assert "stacks" in schema["tables"]
    assert taken["rows"] and {r["proc"] for r in taken["rows"]} == {"workers.2"}
    assert not taken["taken"]["workers.2"].startswith("not taken")


AGENT_QUERIES = re.findall(r"```sql\n(.*?)```", (ROOT / "docs" / "agents.md").read_text(), flags=re.S)
TELEMETRY_DOC = (ROOT / "docs" / "telemetry.md").read_text()
LOG_DOC_QUERIES = [q for q in re.findall(r"```sql\n(.*?)```", TELEMETRY_DOC, flags=re.S)
                   if "FROM logs l" in q or "FROM stacks" in q]


def test_agents_doc_queries_answer_on_a_real_run(live, runs_dir):
    _, run_dir, _ = live
    assert len(AGENT_QUERIES) == 10
    results = [sql(runs_dir, run_dir.name, q) for q in AGENT_QUERIES]
    for i, rows in enumerate(results, 1):
        if i != 9:  # no rollouts in this run
            assert rows, f"agents.md query {i} returned no rows"
    assert results[1][0]["proc"] == "workers.1" and results[1][0]["restarts"] == 2
    assert "last words of rank 1" in [r["message"] for r in results[2] if r["proc"] == "workers.1"]
    assert any(r["function"] == "stuck_in_regex" and r["proc"] == "workers.0" for r in results[5])
    assert {"died", "restarted", "stdout", "log"} <= {r["what"] for r in results[9]}


def test_telemetry_doc_log_and_stack_queries_answer(live, runs_dir):
    _, run_dir, _ = live
    assert len(LOG_DOC_QUERIES) == 2
    last_lines = sql(runs_dir, run_dir.name, LOG_DOC_QUERIES[0].replace("procs.3", "workers.1"))
    assert "last words of rank 1" in [r["message"] for r in last_lines]
    hung = sql(runs_dir, run_dir.name, LOG_DOC_QUERIES[1])
    assert "stuck_in_regex" in [r["function"] for r in hung]


def test_pandas_and_polars_read_the_live_run_from_its_parquet_snapshots(live, runs_dir):
    pytest.importorskip("pandas")
    pytest.importorskip("polars")
    _, run_dir, _ = live
    with pytest.raises(Exception, match="lock"):  # why the snapshots exist: the file is locked while live
        import duckdb

        duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True)
    block = next(b for b in re.findall(r"```python\n(.*?)```", TELEMETRY_DOC, flags=re.S) if "read_parquet" in b)
    live_dir = run_dir / "live"
    deadline = time.monotonic() + 60
    scope: dict = {}
    while True:  # the service snapshots every 5 s: wait until the last lines of the scenario are in
        try:
            exec(block.replace('"runs/latest/live"', repr(str(live_dir))), scope)
            if "last words of rank 1" in set(scope["logs"]["message"]) and scope["deaths"].height >= 3:
                break
        except (FileNotFoundError, OSError):
            pass
        assert time.monotonic() < deadline, f"no usable snapshot in {live_dir}"
        time.sleep(0.5)
    assert set(scope["deaths"]["proc"].to_list()) >= {"workers.0", "workers.1"}


def test_mcp_control_tools_with_the_flag_kill_a_named_proc(live, runs_dir):
    pytest.importorskip("mcp")
    _, run_dir, _ = live

    async def calls(s):
        return (await s.call_tool("inject_fault", {"run": run_dir.name, "proc": "workers.2", "kind": "kill"}))

    res = _mcp_session(runs_dir, calls, allow_control=True)
    assert not res.is_error and res.structured_content["ok"]
    deadline = time.monotonic() + 60
    while True:
        rows = sql(runs_dir, run_dir.name, "SELECT event FROM actors WHERE proc = 'workers.2' "
                   "AND event IN ('died', 'restarted') ORDER BY ts")
        if [r["event"] for r in rows] == ["died", "restarted"] or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert [r["event"] for r in rows] == ["died", "restarted"]


# ---- after the run ------------------------------------------------------------------------------

def test_terminal_echo_prefixes_mesh_and_rank_and_folds_repeated_lines(finished):
    _, out, err = finished
    assert "[workers[0-2] x3] hello from every rank\n" in out
    assert "[workers[0-2] x3] hello from every rank (on stderr)\n" in err
    assert "[workers[1]] last words of rank 1\n" in out
    assert "[workers[2]] ERROR talker: lookup failed\n" in err


def test_after_the_run_the_file_holds_logs_and_stacks(finished, runs_dir):
    run_dir, _, _ = finished
    assert not (run_dir / "live").exists()  # snapshots go with the run; the file is readable now
    rows = sql(runs_dir, run_dir.name, "SELECT (SELECT count(*) FROM logs WHERE message LIKE 'line %') AS lines, "
               "(SELECT count(DISTINCT dump_id) FROM stacks) AS dumps")
    assert rows[0]["lines"] == N_LINES and rows[0]["dumps"] >= 3
    text = cli(runs_dir, "stacks", run_dir.name, "--proc", "workers.0").stdout
    assert "== workers.0" in text and "stuck_in_regex" in text
