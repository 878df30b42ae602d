"""A real browser on the dashboard of a LIVE ppo_cartpole run (``rlmesh run ... telemetry.dashboard=true``,
as a user starts it): headless Chromium driven by Selenium watches the curve gain points, sees the
meshes page show a SIGKILLed generator's death and restart, runs a query in the SQL box and saves
screenshots (under the test's tmp dir; ``RLMESH_DASHBOARD_SHOTS=DIR`` copies them there, for docs)."""

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import warnings
from pathlib import Path

import psutil
import pytest

from dash_helpers import TIMELINE, LineReader, base_of, chromium_or_skip, clean_env, get, wait_for

pytest.importorskip("starlette")

LIVE_PPO = ["recipe=ppo_cartpole", "generator.replicas=2", "generator.num_envs=2", "generator.num_steps=64",
            "trainer.total_steps=10000000", "trainer.num_minibatches=2", "trainer.update_epochs=1",
            "eval.every=1024", "eval.episodes=2", "eval.target=null", "run.progress=false",
            "faults.kill=generator", "faults.start_after_s=8", "faults.every_s=30", "faults.max_faults=1",
            "telemetry.dashboard=true", "telemetry.health_interval_s=1"]


def _js(driver, script):
    return driver.execute_script(script)


def _points(driver, chart_id) -> int:
    return int(_js(driver, f"const d = document.getElementById('chart-{chart_id}'); "
                           "return d && d.dataset.points ? Number(d.dataset.points) : 0;") or 0)


@pytest.mark.timeout(600)
def test_browser_watches_a_live_run_with_a_killed_generator(tmp_path):
    driver = chromium_or_skip()
    t0, TIMELINE[:] = time.monotonic(), []
    shots = tmp_path / "screenshots"
    shots.mkdir()
    run = subprocess.Popen([sys.executable, "-m", "rlmesh.cli", "run", *LIVE_PPO], cwd=tmp_path, env=clean_env(),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                           preexec_fn=_ctrl_c_as_in_a_terminal)
    out = LineReader(run.stdout)
    try:
        url = wait_for(lambda: out.find("dashboard: ") or (run.poll() is not None and "exited"), 180,
                       "the run to print its dashboard URL")
        assert url != "exited", "".join(out.lines)[-3000:]
        assert url.startswith("http://127.0.0.1:") and "?token=" in url
        assert get(url.split("?")[0])[0] == 403  # the same URL without its token

        driver.get(url)  # the run page, live
        first = wait_for(lambda: _points(driver, "reward_env_steps"), 240, "the reward curve's first points")
        wait_for(lambda: _points(driver, "reward_env_steps") > first, 240, "the reward curve to gain points")
        wait_for(lambda: _points(driver, "eval_env_steps") > 0, 240, "the first evaluation point")
        driver.save_screenshot(str(shots / "run.png"))

        driver.get(url.split("?")[0] + "/meshes")

        def death_and_restart():
            rows = _js(driver, "return [...document.querySelectorAll('#events-table tr')].map(r => r.innerText);")
            died = [r for r in rows or [] if "\tdied\t" in r and "\t9\t" in r]
            back = [r for r in rows or [] if "\trestarted\t" in r]
            return died and back and (died, back)

        died, back = wait_for(death_and_restart, 300, "the meshes page to show a generator's SIGKILL and restart")
        assert any("fault_injected" in r for r in _js(
            driver, "return [...document.querySelectorAll('#events-table tr')].map(r => r.innerText);"))

        def restarted_proc():  # the procs table refreshes on its own timer: wait for its next poll
            text = _js(driver, "return document.getElementById('procs-table').innerText;") or ""
            rows = [r.split("\t") for r in text.splitlines()]
            if not rows or "restarts" not in rows[0]:
                return None
            col = rows[0].index("restarts")
            return [r for r in rows[1:] if len(r) > col and r[0] == "rl" and r[col].strip() not in ("", "0")]

        assert wait_for(restarted_proc, 120, "the procs table to count the generator's restart")
        work = _js(driver, "return document.getElementById('work-table').innerText;")
        assert "issued" in work and "re-issued" in work
        driver.save_screenshot(str(shots / "meshes.png"))

        driver.get(url.split("?")[0] + "/health")
        wait_for(lambda: _points(driver, "host_cpu") > 0, 120, "host CPU samples on the health page")
        driver.save_screenshot(str(shots / "health.png"))

        driver.get(url.split("?")[0] + "/sql")
        wait_for(lambda: _js(driver, "return document.querySelectorAll('#schema details').length;"), 120,
                 "the schema beside the SQL box")
        box = driver.find_element("id", "sql-input")
        box.clear()
        box.send_keys("SELECT proc, event, signal, round(recovery_s, 2) AS recovery_s FROM actors "
                      "WHERE event IN ('died', 'restarted') ORDER BY ts")
        driver.find_element("id", "sql-run").click()
        wait_for(lambda: _js(driver, "return document.getElementById('sql-ok') !== null;"), 120, "the query's result")
        text = _js(driver, "return document.getElementById('sql-table').innerText;")
        assert "died" in text and "restarted" in text
        box.clear()
        box.send_keys("SELECT policy_version, count(*) AS rollouts, avg(reward) AS mean_return FROM rollouts "
                      "GROUP BY 1 ORDER BY 1")
        driver.find_element("id", "sql-run").click()
        wait_for(lambda: _js(driver, "const t = document.getElementById('sql-table'); "
                                     "return document.getElementById('sql-ok') !== null && t !== null "
                                     "&& t.innerText.includes('mean_return');"), 120, "the second query's result")
        assert int(_js(driver, "return Number(document.getElementById('sql-chart').dataset.points);")) > 1
        driver.save_screenshot(str(shots / "sql.png"))
        driver.find_element("id", "sql-input").clear()
        driver.find_element("id", "sql-input").send_keys("DELETE FROM rollouts")
        driver.find_element("id", "sql-run").click()
        err = wait_for(lambda: _js(driver, "const e = document.getElementById('sql-error'); return e && e.innerText;"),
                       60, "the refusal of a write")
        assert "read-only" in err

        run_id = url.split("/run/")[1].split("?")[0]
        driver.get(f"{base_of(url)}/compare?runs={run_id},{run_id}")  # the page a sweep's members are overlaid on
        wait_for(lambda: _points(driver, "eval_env_steps") > 0, 120, "the comparison's evaluation chart")
        legend = _js(driver, "return document.getElementById('chart-eval_env_steps').innerText;")
        assert legend.count(run_id) >= 2  # one series per run
        driver.save_screenshot(str(shots / "compare.png"))

        driver.get(base_of(url) + "/")
        wait_for(lambda: _js(driver, "return document.getElementById('runs-table') !== null;"), 60, "the runs list")
        assert "running" in _js(driver, "return document.getElementById('runs-table').innerText;")
        driver.save_screenshot(str(shots / "runs.png"))
        assert run.poll() is None, "the run ended before the checks did"
    finally:
        driver.quit()
        if run.poll() is None:
            os.killpg(run.pid, signal.SIGINT)  # like Ctrl+C: the controller stops its procs and its dashboard
            try:
                run.wait(60)
            except subprocess.TimeoutExpired:  # seen in suite runs, not alone: leave the evidence in a warning
                SLOW_STOP.append(_slow_stop_evidence(run, out))
                try:
                    run.wait(60)
                except subprocess.TimeoutExpired:
                    os.killpg(run.pid, signal.SIGKILL)
                    run.wait(30)
    for f in shots.iterdir():
        assert f.stat().st_size > 10_000, f
    dest = os.environ.get("RLMESH_DASHBOARD_SHOTS")
    if dest:
        Path(dest).mkdir(parents=True, exist_ok=True)
        for f in shots.iterdir():
            shutil.copy(f, Path(dest) / f"dashboard-{f.name}")
    # the dashboard stopped with the run: its port no longer answers
    wait_for(lambda: _refused(url), 60, "the dashboard to stop with the run")
    took = time.monotonic() - t0
    if SLOW_STOP:
        warnings.warn(f"the live run did not stop within 60 s of SIGINT: {SLOW_STOP[0]}", stacklevel=1)
    if took > 90:  # ~30 s alone; twice it took ~150 s inside the suite, unexplained: say where the time went
        warnings.warn(f"the browser test took {took:.0f} s; each wait began at +s and took s: " + "; ".join(
            f"{what} +{start - t0:.0f} {secs:.1f}" for what, start, secs in TIMELINE), stacklevel=1)


SLOW_STOP: list[str] = []


def _ctrl_c_as_in_a_terminal() -> None:
    """In the child before exec: SIGINT (and SIGQUIT) back to their defaults, as a terminal's foreground
    job has them. A suite started in the background of a script (``.ci/run &``) inherits them
    ignored, and a run started so rightly ignores Ctrl-C: that was this test's 120 s "slow stop"."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGQUIT, signal.SIG_DFL)


def _slow_stop_evidence(run: subprocess.Popen, out: LineReader) -> str:
    """What the run's process group is doing: each process's state and command, and the controller's
    thread stacks (``rlmesh run`` prints them on SIGUSR2), as one text for a warning."""
    before = len(out.lines)
    os.kill(run.pid, signal.SIGUSR2)
    wait_for(lambda: len(out.lines) > before or run.poll() is not None, 10, "the controller's stack dump")
    time.sleep(0.5)  # the rest of the dump
    procs = []
    for p in [psutil.Process(run.pid), *psutil.Process(run.pid).children(recursive=True)]:
        try:
            procs.append(f"{p.pid} {p.status()} {' '.join(p.cmdline())[:120]}")
        except psutil.Error:
            continue
    return ("processes: " + " | ".join(procs) + f"\ncontroller signals: {_signal_state(run.pid)}; this test's thread: "
            f"{_signal_state('self/task/' + str(threading.get_native_id()))}, SIGINT handler here "
            f"{signal.getsignal(signal.SIGINT)}\ncontroller stacks:\n" + "".join(out.lines[before:])[-6000:])


def _signal_state(pid: object) -> str:
    """The Sig* lines of /proc/<pid>/status (masks in hex; SIGINT is bit 1, 0x2): a Ctrl-C that was
    ignored (SigIgn) or blocked (SigBlk) since the process started shows here."""
    try:
        with open(f"/proc/{pid}/status") as f:
            wanted = ("SigBlk", "SigIgn", "SigCgt", "SigPnd", "ShdPnd")
            return " ".join(ln.strip().replace("\t", "") for ln in f if ln.startswith(wanted))
    except OSError as exc:
        return f"unreadable ({exc})"


def _refused(url: str) -> bool:
    try:
        get(url)
    except OSError:
        return True
    return False
