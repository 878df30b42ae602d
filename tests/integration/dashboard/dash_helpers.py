"""Start `rlmesh dashboard` as a user does (a subprocess on loopback), talk HTTP to it, drive Chromium."""

from __future__ import annotations

import os
import queue
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

from _support import waiting

ROOT = Path(__file__).resolve().parents[3]
TOKEN = "test-token-0123456789abcdef"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "RLMESH_RUNS_DIR")}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


TIMELINE: list[tuple[str, float, float]] = []
"""``(what, started, took)`` of every :func:`wait_for` that succeeded, in this process (monotonic
seconds): a test that ran far longer than usual can say where its time went (see test_browser.py)."""


def wait_for(pred, timeout: float, what: str, every: float = 0.2):
    """:func:`_support.waiting.wait_for` that also notes how long ``what`` took in :data:`TIMELINE`."""
    start = time.monotonic()
    got = waiting.wait_for(pred, timeout, what, every)
    TIMELINE.append((what, start, time.monotonic() - start))
    return got


class LineReader:
    """Collect a subprocess's stdout lines on a thread, so waiting on one never blocks the test."""

    def __init__(self, stream):
        self.lines: list[str] = []
        self._q: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in stream:
            self.lines.append(line)
            self._q.put(line)

    def find(self, prefix: str) -> str | None:
        return next((ln[len(prefix):].strip() for ln in self.lines if ln.startswith(prefix)), None)


def start_dashboard(runs_dir: Path, *args: str, token: str = TOKEN) -> tuple[subprocess.Popen, str, LineReader]:
    proc = subprocess.Popen([sys.executable, "-m", "rlmesh.cli", "dashboard", "--port", "0", "--runs-dir",
                             str(runs_dir), *args], env=clean_env(RLMESH_DASHBOARD_TOKEN=token),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = LineReader(proc.stdout)
    url = wait_for(lambda: out.find("rlmesh dashboard: ") or (proc.poll() is not None and "exited"), 90,
                   "the dashboard's URL")
    assert url != "exited", "".join(out.lines)
    return proc, url, out


def base_of(url: str) -> str:
    return url.split("/", 3)[0] + "//" + url.split("/", 3)[2]


def get(url: str, headers: dict[str, str] | None = None) -> tuple[int, bytes, dict[str, str]]:
    req = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(req, timeout=60) as r:
            return r.status, r.read(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read(), dict(e.headers)


def chromium_or_skip():
    """A headless Chromium driven by Selenium (scripts/setup_browser.sh installs both), or a skip saying why."""
    import pytest

    webdriver = pytest.importorskip("selenium.webdriver", reason="selenium is not installed (pip install selenium)")
    from selenium.webdriver.chrome.service import Service

    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not binary or not driver:
        pytest.skip("headless Chromium is not installed here: run scripts/setup_browser.sh "
                    "(apt-get install chromium chromium-driver)")
    opts = webdriver.ChromeOptions()
    for flag in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync",
                 "--disable-dev-shm-usage", "--window-size=1400,1000"):
        opts.add_argument(flag)
    opts.add_argument(f"--user-data-dir={tempfile.mkdtemp(prefix='rlmesh-chromium-')}")
    opts.binary_location = binary
    return webdriver.Chrome(service=Service(driver), options=opts)
