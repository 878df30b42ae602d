"""breakpoint() in an endpoint pauses that actor; `rlmesh debug` attaches pdb through a pty, steps, resumes.

Real procs (debug_scenario.py is the controller), a real pty, the real CLI: the test types
into pdb as a person would, changes a local variable, and sees the endpoint return the
changed value, while the other actor kept answering calls the whole time.
"""

import json
import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

import pytest

from test_observe import _env  # noqa: E402 - same environment rules as the other observability tests

HERE = Path(__file__).parent
pytestmark = pytest.mark.timeout(180)


class Pty:
    """A child process on a pseudo-terminal, driven expect-style."""

    def __init__(self, argv: list[str], env: dict[str, str]):
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, env=env, close_fds=True)
        os.close(slave)
        self.seen = ""

    def expect(self, text: str, timeout: float = 60.0) -> str:
        deadline = time.monotonic() + timeout
        while text not in self.seen:
            left = deadline - time.monotonic()
            if left <= 0:
                raise AssertionError(f"did not see {text!r}; got:\n{self.seen[-3000:]}")
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                try:
                    self.seen += os.read(self.master, 65536).decode("utf-8", "replace")
                except OSError:  # the child closed the pty
                    if text not in self.seen:
                        raise AssertionError(f"pty closed before {text!r}; got:\n{self.seen[-3000:]}") from None
        before, _, after = self.seen.partition(text)
        self.seen = after
        return before

    def send(self, line: str) -> None:
        os.write(self.master, line.encode() + b"\n")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(10)
        os.close(self.master)


def _start(env: dict[str, str], *args: str) -> tuple[subprocess.Popen, list[str], list[dict]]:
    """The scenario controller, the `rlmesh debug` command line for its run, and its paused actors once there."""
    ctl = subprocess.Popen([sys.executable, str(HERE / "debug_scenario.py"), *args], env=env, stdin=subprocess.DEVNULL,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = ctl.stdout.readline()
    while line and not line.startswith("READY"):
        line = ctl.stdout.readline()
    assert line.startswith("READY"), ctl.stderr.read()[-4000:]
    run_id = line.split()[1]
    cli = [sys.executable, "-m", "rlmesh.cli", "debug", run_id]
    deadline = time.monotonic() + 60
    while True:  # the actor registers once it reached breakpoint() (or raised)
        out = subprocess.run(cli + ["--format", "json"], env=env, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        paused = json.loads(out.stdout)["paused"]
        if paused or time.monotonic() > deadline:
            return ctl, cli, paused
        time.sleep(0.3)


def test_breakpoint_pauses_one_actor_and_rlmesh_debug_steps_it_through_a_pty(tmp_path):
    env = _env(tmp_path)
    ctl, cli, paused = _start(env)
    try:
        assert [(p["mesh"], p["rank"], p["function"], p["reason"]) for p in paused] == [
            ("dbg", 0, "compute", "breakpoint()")]
        listing = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60).stdout
        assert "dbg[0]" in listing and "compute at" in listing

        session = Pty(cli + ["--attach", "dbg[0]"], env)
        try:
            session.expect("(Pdb) ")
            session.send("p y")
            assert "42" in session.expect("(Pdb) ")
            session.send("where")
            assert "compute" in session.expect("(Pdb) ")
            session.send("y = 5")
            session.expect("(Pdb) ")
            session.send("continue")
            session.expect("resumed")
            assert session.proc.wait(30) == 0
        finally:
            session.close()
        out, err = ctl.communicate(timeout=60)
        assert ctl.returncode == 0, err[-4000:]
        pings = int(out.split("PINGS ", 1)[1].split()[0])
        assert pings > 0  # rank 1 kept answering while rank 0 was paused
        assert "RESULT 10" in out  # the value set in pdb: y = 5 -> 5 * 2
        after = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
        assert after.returncode == 1 and "not live" in after.stderr
    finally:
        if ctl.poll() is None:
            ctl.kill()


def test_post_mortem_pauses_at_an_endpoint_exception_then_the_caller_gets_the_error(tmp_path):
    """RLMESH_POST_MORTEM=1: the raising frame is inspectable in pdb; `continue` lets the error reach the caller."""
    env = _env(tmp_path)
    ctl, cli, paused = _start(env, "post-mortem")
    try:
        assert [(p["mesh"], p["rank"], p["function"]) for p in paused] == [("dbg", 0, "divide")]
        assert paused[0]["reason"].startswith("exception ZeroDivisionError")
        listing = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60).stdout
        assert "exception ZeroDivisionError" in listing
        session = Pty(cli + ["--attach", "dbg[0]"], env)
        try:
            assert "post-mortem: ZeroDivisionError" in session.expect("(Pdb) ")
            session.send("p x, z")
            assert "(7, 0)" in session.expect("(Pdb) ")  # the locals of the frame that raised
            session.send("continue")
            session.expect("resumed")
            assert session.proc.wait(30) == 0
        finally:
            session.close()
        out, err = ctl.communicate(timeout=60)
        assert ctl.returncode == 0, err[-4000:]
        assert int(out.split("PINGS ", 1)[1].split()[0]) > 0  # rank 1 kept answering meanwhile
        assert "RESULT error ActorError" in out and "ZeroDivisionError" in out
    finally:
        if ctl.poll() is None:
            ctl.kill()
