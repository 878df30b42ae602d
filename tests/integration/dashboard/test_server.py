"""`rlmesh dashboard` served for real (uvicorn on loopback, a subprocess): the token is required,
the browser can never name a path outside the runs directory, SQL is read-only and nothing
writes to the database file."""

import csv
import hashlib
import io
import json
import subprocess
import sys
import urllib.error
import urllib.parse
import urllib.request

import pyarrow.parquet as pq
import pytest

from dash_helpers import TOKEN, base_of, clean_env, get, start_dashboard

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")


@pytest.fixture
def finished_run(tmp_path):
    """A finished run with rollouts, train steps, evals and a restart, written by a real controller process."""
    runs = tmp_path / "runs"
    script = """
import json, time
import rlmesh.telemetry as tm
from rlmesh.telemetry import api
for i in range(200):
    tm.record("rollouts", rollout_id=f"r{i}", reward=float(i), length=32, episodes=1, policy_version=i // 4)
    if i % 20 == 0:
        tm.record("samples", rollout_id=f"r{i}", policy_version=i // 4, prompt=f"What is {i} + 1?",
                  completion=f"It is {i + 1}.", answer=str(i + 1), reward=1.0, source="sample.jsonl")
    if i % 4 == 3:
        tm.record("train_steps", step=i // 4 + 1, policy_version=i // 4 + 1, loss=1.0 / (i + 1), samples=128,
                  duration_s=0.01, metrics=json.dumps({"losses/policy_loss": -0.01}))
    if i % 50 == 49:
        tm.record("evals", step=i // 4, policy_version=i // 4, metric="mean_return", value=float(i), episodes=3,
                  env_steps=32 * (i + 1))
api.recorder().record_trusted("actors", {"event": "died", "proc": "rl.2", "mesh": "rl", "rank": 2, "signal": 9})
api.recorder().record_trusted("actors", {"event": "restarted", "proc": "rl.2", "mesh": "rl", "rank": 2,
                                         "incarnation": 1, "serving_s": 0.8})
api.recorder().record_trusted("actors", {"event": "recovered", "proc": "rl.2", "mesh": "rl", "rank": 2,
                                         "incarnation": 1, "serving_s": 0.8, "recovery_s": 1.3,
                                         "reason": "rollout landed"})
tm.flush()  # while the interpreter is alive (see the report: a first conversion at exit can fail)
print(tm.current_run())
"""
    out = subprocess.run([sys.executable, "-c", script], env=clean_env(RLMESH_RUNS_DIR=str(runs),
                         RLMESH_HEALTH_INTERVAL="0"), capture_output=True, text=True, timeout=120, check=True)
    return runs, out.stdout.strip().splitlines()[-1]


def _digest(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.timeout(240)
def test_token_required_read_only_and_nothing_written(finished_run):
    runs, run_id = finished_run
    db = runs / run_id / "telemetry.duckdb"
    before = _digest(db), db.stat().st_mtime_ns
    proc, url, _ = start_dashboard(runs, run_id)
    try:
        base = base_of(url)
        info = runs / run_id / "dashboard.json"
        assert info.stat().st_mode & 0o777 == 0o600 and TOKEN in info.read_text()  # the URL, private
        assert url.startswith("http://127.0.0.1:") and url.endswith(f"/run/{run_id}?token={TOKEN}")
        # no token, a wrong token: 403 on pages, data, SQL and assets alike
        for path in ("/", f"/run/{run_id}", "/api/runs", f"/api/run/{run_id}/sql?q=SELECT%201",
                     "/assets/plotly.min.js", "/assets/dashboard.js"):
            assert get(base + path)[0] == 403, path
            assert get(base + path + ("&" if "?" in path else "?") + "token=wrong-token-wrong-token")[0] == 403, path
        assert get(base + "/api/runs", {"Authorization": "token nope-nope-nope-nope"})[0] == 403
        # the URL's token opens the page and sets the cookie the page's own requests carry
        status, body, headers = get(url)
        assert status == 200 and b"/assets/plotly.min.js" in body
        cookie = headers["set-cookie"].split(";")[0]
        assert "HttpOnly" in headers["set-cookie"] and "SameSite=Strict" in headers["set-cookie"]
        status, body, _ = get(base + "/api/runs", {"Cookie": cookie})
        assert status == 200 and [r["id"] for r in json.loads(body)] == [run_id]
        auth = {"Authorization": f"token {TOKEN}"}
        assert get(base + "/assets/plotly.min.js", auth)[1][:200].find(b"plotly") >= 0  # served offline, from the wheel
        # runs are named by id only: no path reaches outside the runs directory
        for bad in ("..%2F..%2Fetc", "%2Ftmp", ".hidden"):
            assert get(f"{base}/api/run/{bad}/sql?q=SELECT%201", auth)[0] in (404,), bad
        # read-only SQL: every kind of write is refused with the reason, and the file never changes
        for sql in ("DELETE FROM rollouts", "INSERT INTO evals (value) VALUES (1)", "DROP TABLE rollouts",
                    "CREATE TABLE x AS SELECT 1", "UPDATE runs SET status = 'x'", "COPY rollouts TO '/tmp/x.csv'",
                    "ATTACH '/tmp/other.duckdb'", "SELECT 1; DELETE FROM rollouts"):
            status, body, _ = get(f"{base}/api/run/{run_id}/sql?q={urllib.parse.quote(sql)}", auth)
            assert status == 400 and b"read-only" in body, (sql, body)
        # CHECKPOINT changes no data and is allowed by the shared read path (docs/telemetry.md); on a finished
        # run's READ_ONLY attachment it writes nothing: the byte-identical check below covers it.
        assert get(f"{base}/api/run/{run_id}/sql?q=CHECKPOINT", auth)[0] in (200, 400)
        assert get(f"{base}/api/run/{run_id}/sql?q={urllib.parse.quote('SELEC 1')}", auth)[0] == 400
        q = urllib.parse.quote("SELECT policy_version, count(*) AS n FROM rollouts GROUP BY 1 ORDER BY 1")
        res = json.loads(get(f"{base}/api/run/{run_id}/sql?q={q}", auth)[1])
        assert res["row_count"] == 50 and res["rows"][0] == {"policy_version": 0, "n": 4}
        rows = list(csv.DictReader(io.StringIO(get(f"{base}/api/run/{run_id}/sql?q={q}&format=csv", auth)[1].decode())))
        assert len(rows) == 50 and rows[-1] == {"policy_version": "49", "n": "4"}
        tbl = pq.read_table(io.BytesIO(get(f"{base}/api/run/{run_id}/sql?q={q}&format=parquet", auth)[1]))
        assert tbl.num_rows == 50 and tbl.column("n").to_pylist() == [4] * 50
        # every page's data answers
        charts = json.loads(get(f"{base}/api/run/{run_id}/charts?page=run", auth)[1])
        ev = next(c for c in charts if c["id"] == "eval_env_steps")
        assert ev["series"][0]["x"] == [1600, 3200, 4800, 6400]
        meshes = json.loads(get(f"{base}/api/run/{run_id}/meshes", auth)[1])
        assert [r["event"] for r in meshes["events"]["rows"]] == ["died", "restarted", "recovered"]
        assert meshes["events"]["rows"][1]["serving_s"] == 0.8 and meshes["events"]["rows"][2]["recovery_s"] == 1.3
        assert json.loads(get(f"{base}/api/run/{run_id}/charts?page=health", auth)[1])
        assert json.loads(get(f"{base}/api/run/{run_id}/schema", auth)[1])
        shown = json.loads(get(f"{base}/api/run/{run_id}/samples", auth)[1])
        assert len(shown["rows"]) == 10 and shown["rows"][0]["completion"] == "It is 181."  # newest first
        assert get(f"{base}/api/run/{run_id}/samples")[0] == 403
        cmp = json.loads(get(f"{base}/api/compare?runs={run_id},{run_id}&chart=eval_env_steps", auth)[1])
        assert len(cmp[0]["series"]) == 2
        # only GET exists
        req = urllib.request.Request(f"{base}/api/run/{run_id}/sql?token={TOKEN}&q=SELECT%201", method="POST")
        try:
            urllib.request.urlopen(req, timeout=30)
            raise AssertionError("POST was accepted")
        except urllib.error.HTTPError as e:
            assert e.code == 405
    finally:
        proc.terminate()
        proc.wait(30)
    assert not (runs / run_id / "dashboard.json").exists()  # removed when it stops
    assert (_digest(db), db.stat().st_mtime_ns) == before


def test_off_loopback_needs_tls_and_a_real_token(tmp_path):
    env = clean_env()
    out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "dashboard", "--host", "0.0.0.0", "--runs-dir",
                          str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "without TLS" in out.stderr and "--certfile" in out.stderr
    out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "dashboard", "--token", "short", "--runs-dir",
                          str(tmp_path)], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2 and "too short" in out.stderr


@pytest.mark.timeout(180)
def test_a_recipe_started_dashboard_exits_when_its_controller_is_killed(finished_run):
    """`telemetry.dashboard=true` starts the dashboard with --exit-with-pid <controller>: a SIGKILLed
    controller (no atexit, no terminate) must not leave it serving."""
    runs, run_id = finished_run
    controller = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    proc, url, _ = start_dashboard(runs, run_id, "--exit-with-pid", str(controller.pid))
    try:
        assert get(url)[0] == 200
        controller.kill()
        controller.wait(30)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
        if controller.poll() is None:
            controller.kill()
    assert not (runs / run_id / "dashboard.json").exists()


@pytest.mark.timeout(240)
def test_ctrl_c_stops_the_dashboard_quietly(finished_run):
    """Ctrl+C (SIGINT) is how a user stops `rlmesh dashboard`, and a run's Ctrl+C reaches the dashboard it
    started too (same process group): it stops serving, removes its dashboard.json, exits 0, and prints
    no traceback (uvicorn re-raises the interrupt after its graceful stop)."""
    import signal

    runs, run_id = finished_run
    proc, url, out = start_dashboard(runs, run_id)
    try:
        assert get(url)[0] == 200
        proc.send_signal(signal.SIGINT)
        assert proc.wait(60) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    text = "".join(out.lines)
    assert "Traceback" not in text and "KeyboardInterrupt" not in text, text[-2000:]
    assert not (runs / run_id / "dashboard.json").exists()
