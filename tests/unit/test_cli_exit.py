"""The console script's exit (``rlmesh.cli.exit_now``): everything a normal exit does that anything relies
on, minus the interpreter's teardown. Real subprocesses: the exit is the process's own."""

import subprocess
import sys
import textwrap


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=120)


def test_exit_now_waits_for_threads_runs_atexit_flushes_and_keeps_the_code():
    out = _run("""
        import atexit, sys, threading, time
        from rlmesh.cli import exit_now

        atexit.register(lambda: print("atexit ran"))
        def late():
            time.sleep(0.3)
            print("thread done")
        threading.Thread(target=late).start()  # not a daemon: a normal exit waits for it
        threading.Thread(target=time.sleep, args=(60,), daemon=True).start()  # a daemon: it does not
        # an executor's workers stop from threading's own exit hook (joblib's do the same): exit_now must run it
        # before it waits for non-daemon threads, as the interpreter does, or it waits forever
        stop = threading.Event()
        threading._register_atexit(stop.set)
        threading.Thread(target=stop.wait).start()
        print("buffered", end="")  # no newline: still in the buffer when exit_now is called
        sys.stderr.write("to stderr")
        exit_now(3)
    """)
    assert out.returncode == 3
    assert out.stdout == "bufferedthread done\natexit ran\n"
    assert out.stderr == "to stderr"


def test_the_console_script_exits_with_its_commands_code():
    ok = subprocess.run([sys.executable, "-m", "rlmesh.cli", "--help"], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0 and "usage: rlmesh <command>" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "rlmesh.cli", "nonsense"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "unknown command 'nonsense'" in bad.stderr
