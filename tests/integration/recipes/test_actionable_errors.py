"""Issue 37 item 6, as an operator meets them: each of these is one line naming the problem and
the fix, never a traceback. A read-only runs folder (``rlmesh run``; ``rlmesh runs`` over a crashed
run's folder), a full disk, resuming a run that is still live, a refused checkpoint, ``rlmesh sql
--format csv|parquet`` on an INTERVAL column; MCP's ``query`` stays inside ``--runs-dir``; the
output-capture FIFO folder a SIGKILLed controller leaves is reclaimed by ``resume`` and ``rlmesh clean``.

A read-only or full disk is a tmpfs of the test's own (``mount``: root), or, for a user who is not
root, a folder without write permission; without either the test is skipped."""

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import duckdb
import pytest

ROOT = Path(__file__).resolve().parents[3]
RLMESH = [sys.executable, "-m", "rlmesh.cli"]
PPO = ["recipe=ppo_cartpole", "generator.replicas=1", "generator.num_envs=4", "generator.num_steps=32",
       "trainer.update_epochs=2", "trainer.num_minibatches=2", "eval.every=0", "eval.episodes=2",
       "eval.target=null", "telemetry.health_interval_s=0", "run.progress=false"]


def env_for(tmp: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    (tmp / "tmp").mkdir(exist_ok=True)
    env["TMPDIR"] = str(tmp / "tmp")  # this test's own: capture folders are looked for there
    env.update(extra)
    return env


def rlmesh(tmp: Path, *args: str, timeout: float = 300, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(RLMESH + list(args), cwd=tmp, env=env_for(tmp, **env), capture_output=True, text=True,
                          timeout=timeout)


def one_line(out: subprocess.CompletedProcess, prefix: str) -> str:
    """The one line the command ended with; no traceback anywhere in its output."""
    text = out.stdout + out.stderr
    assert "Traceback" not in text, text[-4000:]
    line = out.stderr.strip().splitlines()[-1]
    assert line.startswith(prefix), text[-4000:]
    return line


@contextmanager
def tmpfs(path: Path, size: str = "16m"):
    """A tmpfs of ``size`` at ``path`` (root only: skipped otherwise), unmounted afterwards."""
    path.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs",
                                            str(path)], capture_output=True).returncode != 0:
        pytest.skip("needs a tmpfs of its own (mount, as root)")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], capture_output=True)


@contextmanager
def read_only(path: Path):
    """``path`` as it is now, read-only: a tmpfs remounted ``ro`` (root), or mode 0555 (any other user)."""
    if os.geteuid() != 0:
        modes = {p: p.stat().st_mode for p in [path, *path.rglob("*")] if p.is_dir()}
        for p in modes:
            p.chmod(0o555)
        try:
            yield
        finally:
            for p, m in modes.items():
                p.chmod(m)
        return
    subprocess.run(["mount", "-o", "remount,ro", str(path)], check=True)
    try:
        yield
    finally:
        subprocess.run(["mount", "-o", "remount,rw", str(path)], check=True)


@contextmanager
def runs_folder(tmp: Path):
    if os.geteuid() == 0:
        with tmpfs(tmp / "runs") as d:
            yield d
    else:
        (tmp / "runs").mkdir()
        yield tmp / "runs"


@pytest.mark.timeout(300)
def test_a_read_only_runs_folder_is_one_line(tmp_path):
    with runs_folder(tmp_path) as runs:
        crashed = runs / "20260101-000000-dead"  # a controller killed outright: run.json says running
        crashed.mkdir()
        info = {"id": crashed.name, "status": "running", "start_ts": time.time() - 60, "pid": 2**22 + 17,
                "host": socket.gethostname(), "argv": ["rlmesh", "run"], "rows": 0}
        (crashed / "run.json").write_text(json.dumps(info))
        (crashed / "service.json").write_text(json.dumps({"pid": info["pid"], "host": info["host"]}))
        duckdb.connect(str(crashed / "telemetry.duckdb")).close()
        with read_only(runs):
            out = rlmesh(tmp_path, "run", *PPO, "trainer.total_steps=2000", RLMESH_RUNS_DIR=str(runs))
            assert out.returncode == 1
            line = one_line(out, "rlmesh run: ")
            assert ("read-only file system" in line or "permission denied" in line) and "RLMESH_RUNS_DIR" in line, line
            listed = rlmesh(tmp_path, "runs", "--format", "json", RLMESH_RUNS_DIR=str(runs))
            assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
            assert crashed.name in listed.stdout and "crashed" in listed.stdout
            assert "cannot be settled" in listed.stderr and len(listed.stderr.strip().splitlines()) == 1, listed.stderr


@pytest.mark.timeout(400)
def test_a_full_disk_is_one_line(tmp_path):
    with tmpfs(tmp_path / "runs", size="3m") as runs:
        out = rlmesh(tmp_path, "run", *PPO, "trainer.total_steps=2000000", RLMESH_RUNS_DIR=str(runs), timeout=360)
    assert out.returncode == 1
    line = one_line(out, "rlmesh run: no space left on device writing ")
    assert str(runs) in line and "free space on that disk" in line, line
    told = [ln for ln in (out.stdout + out.stderr).splitlines() if "no space left on device" in ln]
    assert len(told) <= 3, told  # the recorder's, the trainer's final checkpoint's, and the run's: once each


def _wait_for(what, cond, proc: subprocess.Popen, limit: float = 240):
    deadline = time.monotonic() + limit
    while not (got := cond()):
        assert proc.poll() is None, f"the run ended before {what}: {proc.communicate()[1][-3000:]}"
        assert time.monotonic() < deadline, f"no {what} after {limit:.0f}s"
        time.sleep(0.05)
    return got


def _capture_dirs(tmp: Path, pid: int) -> list[Path]:
    return list((tmp / "tmp").glob(f"rlmesh-capture-{pid}-*"))


@pytest.mark.timeout(600)
def test_resume_of_a_live_run_a_refused_checkpoint_and_a_killed_controllers_fifos(tmp_path):
    runs = tmp_path / "runs"
    live = subprocess.Popen(RLMESH + ["run", *PPO, "trainer.total_steps=5000000"], cwd=tmp_path, env=env_for(tmp_path),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        ckpt = _wait_for("a checkpoint", lambda: sorted(runs.glob("2*/checkpoints/step_*.json")), live)
        run_dir = ckpt[0].parents[1]
        t0 = time.monotonic()
        out = rlmesh(tmp_path, "run", "resume=latest")
        assert out.returncode == 2 and time.monotonic() - t0 < 60
        line = one_line(out, "config error: resume=latest: ")
        assert f"run {run_dir.name} is still running (controller pid {live.pid}" in line and f"kill {live.pid}" in line
        assert _capture_dirs(tmp_path, live.pid)
    finally:
        live.kill()  # SIGKILL: no cleanup runs, the FIFO folder stays
        live.communicate(timeout=60)
    assert _capture_dirs(tmp_path, live.pid)

    newest = max(run_dir.glob("checkpoints/step_*.json")).with_suffix(".pt")
    with open(newest, "ab") as f:
        f.write(b"planted")
    out = rlmesh(tmp_path, "run", "resume=latest", "trainer.total_steps=6000000")
    assert out.returncode == 1
    line = one_line(out, "rlmesh run: trainer[0]: CheckpointError")
    assert f"mv {newest} {newest}.refused" in line and "previous checkpoint" in line, line
    assert not _capture_dirs(tmp_path, live.pid)  # the resume reclaimed the dead controller's folder

    other = subprocess.Popen(RLMESH + ["run", *PPO, "trainer.total_steps=5000000"], cwd=tmp_path,
                             env=env_for(tmp_path, RLMESH_RUNS_DIR=str(tmp_path / "runs2")),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for("a running proc", lambda: list((tmp_path / "runs2").glob("2*/telemetry.duckdb"))
                  and _capture_dirs(tmp_path, other.pid), other)
    finally:
        other.send_signal(signal.SIGKILL)
        other.communicate(timeout=60)
    assert _capture_dirs(tmp_path, other.pid)
    cleaned = rlmesh(tmp_path, "clean", RLMESH_RUNS_DIR=str(tmp_path / "runs2"))
    assert cleaned.returncode == 0 and "removed 1 output-capture folder(s)" in cleaned.stdout, cleaned.stdout
    assert not _capture_dirs(tmp_path, other.pid)


@pytest.mark.timeout(120)
def test_sql_writes_an_interval_column_as_csv_and_parquet(tmp_path):
    db = tmp_path / "iv.duckdb"
    with duckdb.connect(str(db)) as con:
        con.execute("CREATE TABLE t AS SELECT INTERVAL 90 MINUTE AS d, INTERVAL 14 MONTH + INTERVAL 3 DAY AS e, 1 AS x")
    sql = "SELECT d, e, x FROM t"
    out = rlmesh(tmp_path, "sql", str(db), sql, "--format", "csv", timeout=60)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert out.stdout.splitlines() == ['"d","e","x"', '"01:30:00","1 year 2 months 3 days",1']
    out = rlmesh(tmp_path, "sql", str(db), sql, "--format", "parquet", "--out", str(tmp_path / "o.parquet"), timeout=60)
    assert out.returncode == 0 and "Traceback" not in out.stderr, out.stderr
    assert duckdb.sql(f"SELECT d, e FROM '{tmp_path / 'o.parquet'}'").fetchall() == [("01:30:00", "1 year 2 months 3 days")]
    out = rlmesh(tmp_path, "sql", str(db), "SELECT {'a': d} AS s FROM t", "--format", "parquet", "--out",
                 str(tmp_path / "s.parquet"), timeout=60)
    assert out.returncode == 1
    assert "cast that column" in one_line(out, "rlmesh sql: --format parquet cannot hold this result")


@pytest.mark.timeout(120)
def test_mcp_query_reads_only_runs_inside_its_runs_dir(tmp_path):
    pytest.importorskip("mcp")
    from mcp import ClientSession
    from mcp.client.stdio import StdioServerParameters, stdio_client

    for d in (tmp_path / "runs" / "20260101-000000-aaaa", tmp_path / "outside" / "secret"):
        d.mkdir(parents=True)
        with duckdb.connect(str(d / "telemetry.duckdb")) as con:
            con.execute(f"CREATE TABLE t AS SELECT '{d.name}' AS who")
    params = StdioServerParameters(command=sys.executable, args=["-m", "rlmesh.cli", "mcp", "--runs-dir",
                                                                 str(tmp_path / "runs")], env=env_for(tmp_path))

    async def main():
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                ask = {"sql": "SELECT who FROM t"}
                inside = await s.call_tool("query", {**ask, "run": "20260101-000000-aaaa"})
                return inside, [await s.call_tool("query", {**ask, "run": run}) for run in (
                    "../outside/secret", str(tmp_path / "outside" / "secret"),
                    str(tmp_path / "outside" / "secret" / "telemetry.duckdb"))]

    inside, outside = asyncio.run(asyncio.wait_for(main(), 90))
    assert inside.structured_content["rows"] == [{"who": "20260101-000000-aaaa"}]
    for res in outside:
        assert res.is_error and "outside the runs folder" in res.content[0].text, res
