"""A frame over ``RLMESH_MAX_MESSAGE_MB`` is refused before it is buffered (issue 37, item 3).

Calls are read before they are authenticated, so anyone who reaches a worker's socket could make it
hold a frame of any size: one 1 GiB frame raised a worker's RSS by 1 GB before the MAC refused it.
Here, with the limit at 8 MB, an unauthenticated raw zmq socket sends a 96 MiB frame to a worker's
call socket and to the controller's socket: each drops the connection at the frame's size header
(the sender sees the disconnect), its peak RSS (``VmHWM``) does not grow by the frame, and it still
serves. Legitimate senders learn of the limit at the call, not by a silent drop; weight pulls over
TCP (8 MiB chunks on their own channel) are not limited.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]
pytestmark = pytest.mark.timeout(300)

SCRIPT = r"""
import json, os, time
os.environ["RLMESH_MAX_MESSAGE_MB"] = "8"
import numpy as np
import torch
import zmq
import zmq.utils.monitor
import rlmesh as rm
from rlmesh.actor.controller import Controller

FRAME = 96 << 20

def hwm() -> int:
    # peak RSS of this process so far, bytes: a frame buffered whole and freed at once still shows here
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmHWM:"))

class Probe(rm.Actor):
    @rm.endpoint
    def hwm(self) -> int:
        return hwm()

    @rm.endpoint
    def echo(self, a):
        return a.nbytes

    @rm.endpoint
    def make(self, n: int):
        return np.ones(n, dtype=np.uint8)

class Pub(rm.Actor):
    def __init__(self):
        self.pub = rm.weights.Publisher("big")

    @rm.endpoint
    def publish(self, v: int) -> int:
        return self.pub.publish({"w": torch.full((6 << 20,), float(v))}, version=v).bytes  # 24 MiB

class Sub(rm.Actor):
    def __init__(self):
        self.sub = rm.weights.Subscriber("big", "tcp")
        self.model = {"w": torch.zeros(6 << 20)}

    @rm.endpoint
    def pull(self, v: int) -> list:
        got = self.sub.pull_into(self.model, min_version=v, timeout=60)
        return [int(got), got.stats.transport, bool((self.model["w"] == float(v)).all())]

def flood(addr: str, peak_now, base: int) -> dict:
    # One FRAME-byte frame from an unauthenticated socket; waits for the target to drop the connection,
    # or for its peak RSS to show the frame buffered (the failure this test exists for), whichever comes first.
    ctx = zmq.Context.instance()
    s = ctx.socket(zmq.DEALER)
    s.setsockopt(zmq.LINGER, 0)
    mon = s.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECTED)
    s.connect(addr.split("#", 1)[0])
    s.send(b"\x01" * FRAME, copy=False)
    deadline, disconnected, peak = time.monotonic() + 180, False, base
    while time.monotonic() < deadline and not disconnected:
        if mon.poll(200):
            disconnected = zmq.utils.monitor.recv_monitor_message(mon)["event"] == zmq.EVENT_DISCONNECTED
        peak = peak_now()
        if peak - base > FRAME // 2:
            break
    s.disable_monitor()
    mon.close(0)
    s.close(0)
    return {"disconnected": disconnected, "grew": peak_now() - base}

procs = rm.this_host().spawn_procs(per_host={"procs": 3})
probe = procs.slice(procs=0).spawn("probe", Probe)
out = {}
probe.echo.call_one(np.zeros(1 << 20, dtype=np.uint8)).get(timeout=120)  # warm: the first call's own peak
base = probe.hwm.call_one().get(timeout=120)
out["worker"] = flood(probe._points[0].addr, lambda: probe.hwm.call_one().get(timeout=120), base)
out["worker_serves"] = probe.echo.call_one(np.zeros(4 << 20, dtype=np.uint8)).get(timeout=120)
base = hwm()
out["controller"] = flood(Controller.current().addr, hwm, base)
out["controller_serves"] = probe.hwm.call_one().get(timeout=120) > 0
try:
    probe.echo.call_one(np.zeros(16 << 20, dtype=np.uint8))
    out["big_call"] = "sent"
except Exception as exc:
    out["big_call"] = f"{type(exc).__name__}: {exc}"
try:
    probe.make.call_one(16 << 20).get(timeout=120)
    out["big_result"] = "returned"
except Exception as exc:
    out["big_result"] = f"{type(exc).__name__}: {exc}"
pub = procs.slice(procs=1).spawn("pub", Pub)
sub = procs.slice(procs=2).spawn("sub", Sub)
pub.publish.call_one(1).get(timeout=120)
out["tcp_pull"] = sub.pull.call_one(1).get(timeout=120)
procs.stop()
print("RESULT " + json.dumps(out))
"""


def test_an_oversize_frame_is_refused_unread_and_the_limit_is_said_at_the_call(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RLMESH_RUNS_DIR": str(tmp_path / "runs")}
    for k in ("RLMESH_JOB_ID", "RLMESH_SECRET", "RLMESH_MAX_MESSAGE_MB"):
        env.pop(k, None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=280)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and line, out.stdout[-2000:] + out.stderr[-4000:]
    r = json.loads(line[-1][len("RESULT "):])
    frame = 96 << 20
    for who in ("worker", "controller"):
        assert r[who]["grew"] < frame // 4, r  # refused at the size header, not buffered whole
        assert r[who]["disconnected"], r
    assert r["worker_serves"] == 4 << 20 and r["controller_serves"]
    assert r["big_call"].startswith("MessageTooLarge") and "RLMESH_MAX_MESSAGE_MB" in r["big_call"], r["big_call"]
    assert "MessageTooLarge" in r["big_result"] and "RLMESH_MAX_MESSAGE_MB" in r["big_result"], r["big_result"]
    assert r["tcp_pull"] == [1, "tcp", True], r["tcp_pull"]  # 8 MiB chunks on the weights channel: no limit there
