"""``kill -USR2`` on ``rlmesh run``: every thread's stack on stderr, also after the set-up ran twice in
one process (sweep jobs run one after another in the same one). A real process and a real signal."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import asyncio, os, signal, sys
from rlmesh.recipes.runner import dump_stacks_on_sigusr2

dump_stacks_on_sigusr2()
dump_stacks_on_sigusr2()  # the second job of an in-process sweep

async def main():
    waiting = asyncio.ensure_future(asyncio.sleep(30))
    await asyncio.sleep(0)
    os.kill(os.getpid(), signal.SIGUSR2)
    await asyncio.sleep(0.2)  # the Python half runs when the main thread runs Python again
    waiting.cancel()

asyncio.run(main())
"""


def test_sigusr2_prints_threads_then_the_loops_tasks_after_two_set_ups():
    r = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == 0, r.stderr
    assert "Current thread" in r.stderr, r.stderr  # faulthandler's dump: lost to the second set-up before
    assert "asyncio: 2 task(s)" in r.stderr and "in main" in r.stderr, r.stderr
    assert r.stderr.index("Current thread") < r.stderr.index("asyncio:")


CRASH = """
import os, signal, threading
from rlmesh.recipes.runner import dump_stacks_on_sigusr2

dump_stacks_on_sigusr2()
threading.Thread(target=threading.Event().wait, name="parked", daemon=True).start()
os.abort()  # what a C library does when it gives up
"""


def test_a_crash_prints_every_threads_stack():
    r = subprocess.run([sys.executable, "-c", CRASH], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert r.returncode == -6, (r.returncode, r.stderr)
    assert "Fatal Python error: Aborted" in r.stderr, r.stderr
    assert r.stderr.count("Thread 0x") + r.stderr.count("Current thread 0x") >= 2, r.stderr  # main + parked
