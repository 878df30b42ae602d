"""A write-ahead log that does not replay whole is said in one line; the rows before the tear are kept.

DuckDB 2.0.1 replays a truncated log up to the tear without a word, and refuses a database whose
log has a damaged entry. A real controller records rows and is SIGKILLed before its first
checkpoint, so its rows live in ``telemetry.duckdb.wal``; copies of the run get the log cut at
several points (and one damaged in the middle), then are opened the two ways a person would:
``rlmesh sql`` and a resume of the run.
"""

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import duckdb
import pytest

HERE = Path(__file__).parent
COUNT = "SELECT count(*) AS n, coalesce(max(seq), -1) AS hi FROM ticks"
RESUME = """
import sys, rlmesh as rm
rm.telemetry.start_run(run_id=sys.argv[1], resume=True)
rm.telemetry.record("after_resume", x=1)
rm.telemetry.end_run()
"""


def _env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RLMESH_TELEMETRY", "RLMESH_RUN_ID"))}
    env.update(RLMESH_RUNS_DIR=str(root), RLMESH_TELEMETRY_CHECKPOINT_S="3600",
               PYTHONPATH=os.pathsep.join([str(HERE), env.get("PYTHONPATH", "")]))
    return env


def _lines(err: str) -> list[str]:
    return [ln for ln in err.splitlines() if "did not replay whole" in ln]


def _ticks(db: Path) -> tuple[int, int]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(COUNT).fetchone()
    except duckdb.CatalogException:  # the table itself was created in the log
        return 0, -1
    finally:
        con.close()


def _sql(root: Path, run_id: str) -> tuple[subprocess.CompletedProcess, int, int]:
    import json

    out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "sql", run_id, COUNT, "--format", "json"],
                         env=_env(root), capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    row = json.loads(out.stdout)["rows"][0]
    return out, row["n"], row["hi"]


@pytest.fixture(scope="module")
def killed_run(tmp_path_factory):
    """A run whose controller was SIGKILLed with its rows in the log: (runs root, run id, rows in the log)."""
    root = tmp_path_factory.mktemp("killed")
    p = subprocess.Popen([sys.executable, str(HERE / "scenario.py"), "durability"], env=_env(root),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = p.stdout.readline()
    assert line.startswith("RECORDING"), p.stderr.read()
    run_id = line.split()[1]
    run_dir = root / run_id
    side = run_dir / "telemetry.duckdb.committed"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:  # until the sidecar says >= 3000 ticks are committed (in the log)
        try:
            import json

            if json.loads(side.read_text())["rows"].get("ticks", 0) >= 3000:
                break
        except (OSError, ValueError):
            pass
        time.sleep(0.05)
    else:
        raise AssertionError("the run did not commit 3000 rows in 120 s")
    os.kill(p.pid, signal.SIGKILL)
    p.wait(timeout=30)
    assert (run_dir / "telemetry.duckdb.wal").stat().st_size > 0
    probe = tmp_path_factory.mktemp("probe")
    shutil.copytree(run_dir, probe / run_id)
    whole, _ = _ticks(probe / run_id / "telemetry.duckdb")
    (probe / run_id / "telemetry.duckdb.wal").unlink()
    in_file, _ = _ticks(probe / run_id / "telemetry.duckdb")
    assert whole >= 3000 and in_file < whole // 10, (whole, in_file)  # the rows are in the log, not the file
    return root, run_id, whole, in_file


def _cut_copy(tmp_path: Path, killed_run, cut) -> tuple[Path, Path]:
    root, run_id, *_ = killed_run
    dst_root = tmp_path / "runs"
    shutil.copytree(root / run_id, dst_root / run_id)
    log = dst_root / run_id / "telemetry.duckdb.wal"
    size = log.stat().st_size
    if cut == "damaged":  # a torn page in the middle: DuckDB refuses the whole database
        with open(log, "r+b") as f:
            f.seek(size // 2)
            f.write(b"\0" * 4096)
    else:
        os.truncate(log, int(size * cut))
    return dst_root, dst_root / run_id


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cut", [0.9, 0.5, 0.15, "damaged"])
def test_rlmesh_sql_says_what_a_torn_log_lost_and_keeps_the_rest(tmp_path, killed_run, cut):
    _, run_id, whole, in_file = killed_run
    root, run_dir = _cut_copy(tmp_path, killed_run, cut)
    cut_size = (run_dir / "telemetry.duckdb.wal").stat().st_size
    out, n, hi = _sql(root, run_id)
    assert in_file <= n < whole and hi == n - 1, (n, hi, whole)  # a prefix, every row before the tear
    lines = _lines(out.stderr)
    assert len(lines) == 1, out.stderr
    assert re.search(rf"\b{n} of {whole} ticks rows", lines[0]), lines[0]  # what was committed, what is kept
    print(f"cut {cut}: kept {n} of {whole} ticks rows (in the file before the log: {in_file})")
    copy = run_dir / "telemetry.duckdb.wal.torn"
    assert str(copy) in lines[0] and copy.exists()
    if cut != "damaged":
        assert copy.stat().st_size == cut_size
    again, n2, _ = _sql(root, run_id)  # said again on the next open, same rows, no second copy
    assert n2 == n and _lines(again.stderr) == lines
    assert not (run_dir / "telemetry.duckdb.wal.torn-2").exists()


@pytest.mark.timeout(300)
@pytest.mark.parametrize("cut", [0.5, "damaged"])
def test_a_resume_says_what_a_torn_log_lost_and_keeps_the_rest(tmp_path, killed_run, cut):
    _, run_id, whole, in_file = killed_run
    root, run_dir = _cut_copy(tmp_path, killed_run, cut)
    out = subprocess.run([sys.executable, "-c", RESUME, run_id], env=_env(root), capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    lines = _lines(out.stderr)
    assert len(lines) == 1, out.stderr  # once, though the run is settled and then opened
    assert (run_dir / "telemetry.duckdb.wal.torn").exists()
    n, hi = _ticks(run_dir / "telemetry.duckdb")  # the resumed file: every row before the tear, then the new run
    assert in_file <= n < whole and hi == n - 1 and re.search(rf"\b{n} of {whole} ticks rows", lines[0]), lines
    con = duckdb.connect(str(run_dir / "telemetry.duckdb"), read_only=True)
    assert con.execute("SELECT count(*) FROM after_resume").fetchone()[0] == 1
    con.close()
    later, n2, _ = _sql(root, run_id)  # the loss is still said after the log is folded into the file
    assert n2 == n and len(_lines(later.stderr)) == 1


@pytest.mark.timeout(300)
def test_a_whole_log_is_replayed_without_a_word(tmp_path, killed_run):
    _, run_id, whole, _ = killed_run
    root, _ = _cut_copy(tmp_path, killed_run, 1.0)
    out, n, hi = _sql(root, run_id)
    assert (n, hi) == (whole, whole - 1) and not _lines(out.stderr), out.stderr
