"""Controller programs of the network-namespace tests, each run in a fresh interpreter (conftest.run_scenario).

The controller listens on the bridge (``RLMESH_BIND_HOST``, set by the test to the bridge's
address); its procs run on the hosts in ``NETNS_TEST_HOSTS`` (``rm.this_host(netns=hosts)``).
Each program prints one JSON line of what it saw; the tests assert on it.

    apart      one mesh across three hosts: calls, the wire, refused peers, telemetry, the
               debugger, weights over TCP, the workspace chain
    partition  a host's link cut while its proc lives: detected, replaced, nothing lost; the
               link back: the old incarnation fenced, one live copy
"""

import io
import json
import os
import socket
import sys
import tempfile
import threading
import time

import zmq
from zmq.utils.monitor import recv_monitor_message

import rlmesh as rm
from rlmesh import settings
from rlmesh.actor.controller import Controller
from rlmesh.agents.debug_cli import attach, paused
from rlmesh.errors import ActorDied
from rlmesh.launch.netns import NetnsHost, cut, restore
from rlmesh.telemetry import api
from rlmesh.transport import Authenticator
from rlmesh.workspace import sync_workspace

from netns_actors import Peer, Worker

HOSTS = [NetnsHost(**h) for h in json.loads(os.environ["NETNS_TEST_HOSTS"])]
MARKER = b"NETNS-PLAINTEXT-MARKER-7d2e"


def wait_for(pred, timeout: float, what: str, every: float = 0.05):
    deadline = time.monotonic() + timeout
    while True:
        got = pred()
        if got:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(every)


class Sniffer:
    """Every frame crossing a link (an AF_PACKET socket on the bridge's end of it), while in ``with``."""

    def __init__(self, dev: str):
        self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(3))  # ETH_P_ALL
        self.sock.bind((dev, 0))
        self.sock.settimeout(0.1)
        self.data = bytearray()
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.data += self.sock.recv(1 << 17)
            except TimeoutError:
                pass

    def __enter__(self) -> "Sniffer":
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        time.sleep(0.2)  # the last frames of the reply
        self.stop.set()
        self.thread.join()
        self.sock.close()


FAILED = {zmq.Event.HANDSHAKE_FAILED_AUTH, zmq.Event.HANDSHAKE_FAILED_PROTOCOL, zmq.Event.HANDSHAKE_FAILED_NO_DETAIL}


def dial_as_stranger(addr: str, kind: str) -> dict:
    """Connect to a proc's channel from this host as a peer without the job's keys and send a message:
    ``plain`` (no CurveZMQ at all), ``wrong-key`` (knows the server's public key, has a key of its own),
    ``job-key`` (the job's CurveZMQ keys, but a message without the channel's MAC)."""
    endpoint = addr.partition("#")[0]
    keys = Authenticator.from_env().curve_keys()
    s = zmq.Context.instance().socket(zmq.DEALER)
    s.linger = 0
    if kind != "plain":
        s.curve_serverkey = keys.server_public
        if kind == "wrong-key":
            s.curve_publickey, s.curve_secretkey = zmq.curve_keypair()
        else:
            s.curve_publickey, s.curve_secretkey = keys.client_public, keys.client_secret
    mon = s.get_monitor_socket()
    s.connect(endpoint)
    s.send(b"\x80\x05" + b"N." * 40)  # a pickle, were it ever unpickled
    events: list[str] = []
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if mon.poll(100):
            ev = zmq.Event(recv_monitor_message(mon)["event"])
            events.append(ev.name)
            if ev in FAILED or ev == zmq.Event.HANDSHAKE_SUCCEEDED:
                break
    reply = bool(s.poll(1000))
    s.disable_monitor()
    mon.close(0)
    s.close(0)
    return {"events": events, "reply": reply}


def apart() -> dict:
    out: dict = {"controller": Controller.get().addr, "hosts": [h.hostname for h in HOSTS], "phases": {}}
    t = [time.monotonic()]

    def phase(name: str) -> None:  # seconds each part took, for whoever reads a slow run's output
        now = time.monotonic()
        out["phases"][name] = round(now - t[0], 2)
        t[0] = now
    procs = rm.this_host(netns=HOSTS).spawn_procs(per_host={"procs": 3}, name="net")
    recs = [Controller.current().procs[p] for p in procs.proc_ids]
    out["proc_addrs"] = [r.addr for r in recs]
    peers = procs.spawn("peer", Peer)
    out["where"] = peers.where.call().get().values()
    phase("start")

    # a call across the bridge, and what the wire carried
    with Sniffer(HOSTS[1].link) as sn:
        back = peers.slice(procs=1).echo.call_one(MARKER * 4096).get()
    out["echo_ok"] = back == MARKER * 4096
    out["wire_bytes"] = len(sn.data)
    out["marker_on_wire"] = MARKER in sn.data

    out["strangers"] = {k: dial_as_stranger(recs[1].addr, k) for k in ("plain", "wrong-key", "job-key")}
    out["still_serving"] = peers.slice(procs=1).echo.call_one(b"ok").get() == b"ok"
    phase("transport")

    # telemetry rows recorded on the hosts reach the controller's DuckDB file
    peers.record.call(5).get()
    q = "SELECT host, count(*) AS n FROM netns_rows GROUP BY host ORDER BY host"
    out["rows"] = wait_for(lambda: (lambda t: t if len(t) == 3 and all(r["n"] == 5 for r in t) else None)(
        _rows(q)), 90, "netns_rows from all three hosts")
    phase("telemetry")

    # the debugger: an actor on host 2 paused at breakpoint(), attached to from the controller's host
    fut = peers.slice(procs=2).pause.call_one()
    run_dir = api.current_run_dir()
    info = wait_for(lambda: [e for e in paused(run_dir) if e["host"] == HOSTS[2].hostname], 90, "the pause on host 2")[0]
    r, w = os.pipe()
    os.write(w, b"answer = 42\ncontinue\n")
    os.close(w)
    screen = io.StringIO()
    with os.fdopen(r) as stdin:
        code = attach(info, bytes.fromhex(settings.SECRET.get()), stdin=stdin, stdout=screen)
    out["debug"] = {"code": code, "result": fut.get(timeout=90), "addr": info["addr"], "host": info["host"],
                    "screen": screen.getvalue()[-500:]}
    phase("debugger")

    # weights: published on host 0, pulled on hosts 1 and 2
    total = peers.slice(procs=0).publish.call_one(4, 1).get()
    pulls = [peers.slice(procs=i).pull.call_one(1) for i in (1, 2)]
    out["weights"] = {"published_sum": total, "pulls": [p.get(timeout=120) for p in pulls]}
    phase("weights")

    # the workspace chain: source (controller) -> host 0 -> host 1 -> host 2
    with tempfile.TemporaryDirectory() as tmp:
        src = os.path.join(tmp, "src")
        os.makedirs(os.path.join(src, "data"))
        with open(os.path.join(src, "netns_synced.py"), "w") as f:
            f.write("WHERE = 'synced'\n")
        with open(os.path.join(src, "data", "blob.bin"), "wb") as f:
            f.write(os.urandom(3 << 20))
        rows = sync_workspace(procs, src, store_dir=os.path.join(tmp, "stores"), dest_root=os.path.join(tmp, "hosts"),
                              simulate_hosts=True, editable=False, timeout=120)
        out["workspace"] = [{"host": r.host, "error": r.stats.error, "transport": r.stats.transport,
                             "bytes": r.stats.bytes_received, "files": r.stats.files} for r in rows]
        out["imported"] = peers.imported.call().get().values()
        phase("workspace")
    procs.stop()  # the procs ship their last rows (the spans of the calls above) as they stop
    out["span_hosts"] = wait_for(lambda: _rows(
        "SELECT DISTINCT a.host FROM spans s JOIN actors a ON a.mesh = 'net' AND a.rank = s.rank "
        "AND a.event = 'spawned' WHERE s.mesh = 'peer' AND s.endpoint = 'where' ORDER BY 1"), 90, "spans")
    phase("stop")
    return out


def _rows(sql: str) -> list[dict]:
    try:
        return rm.telemetry.query(sql).to_pylist()
    except Exception:  # noqa: BLE001 - the table does not exist yet
        return []


def partition() -> dict:
    """Work items go to two procs on hosts 0 and 1; host 1's link is cut mid-stream. Its proc is declared
    dead by its silence (it lives on), its items are re-issued, and its replacement starts on host 2.
    Then the link comes back: the old incarnation dials in, is fenced, and exits."""
    out: dict = {}
    procs = rm.this_host(netns=HOSTS).spawn_procs(per_host={"procs": 2}, name="part",
                                                  restart=rm.Restart(max_restarts=-1))
    workers = procs.spawn("worker", Worker)
    recs = [Controller.current().procs[p] for p in procs.proc_ids]  # the live records: they follow restarts
    old = {"pid": recs[1].pid, "incarnation": recs[1].incarnation}
    out["old"] = old
    done: dict[int, dict] = {}
    reissued = 0
    items = list(range(40))
    cut_at, restored = 10, False

    def run(i: int) -> dict:
        nonlocal reissued
        while True:
            try:
                return workers.slice(procs=i % 2).work.call_one(i).get(timeout=60)
            except ActorDied:
                reissued += 1
                wait_for(lambda: recs[1].state == "alive", 60, "the replacement of part.1")

    t_cut = None
    for i in items:
        if i == cut_at:
            cut(HOSTS[1])
            t_cut = time.monotonic()
        done.setdefault(i, run(i))
        if t_cut is not None and not restored and recs[1].incarnation > old["incarnation"] and recs[1].state == "alive":
            out["detect_and_replace_s"] = time.monotonic() - t_cut
            restored = True
    wait_for(lambda: recs[1].state == "alive" and recs[1].incarnation > old["incarnation"], 60, "the replacement")
    out.setdefault("detect_and_replace_s", time.monotonic() - t_cut)
    out["new"] = {"pid": recs[1].pid, "incarnation": recs[1].incarnation, "host": recs[1].host}
    out["old_alive_while_cut"] = _alive(old["pid"])
    restore(HOSTS[1])
    t_back = time.monotonic()
    # its first message after the cut waits for TCP's retransmission timer, which backs off while the link
    # is down (seconds after a long cut): the bound is a hang bound
    wait_for(lambda: not _alive(old["pid"]), 120, "the old incarnation to exit once fenced")
    out["old_exit_after_restore_s"] = time.monotonic() - t_back
    out["after"] = [workers.slice(procs=1).work.call_one(100 + k).get(timeout=30) for k in range(3)]
    out["items"] = sorted(done)
    out["item_hosts"] = sorted({d["host"] for d in done.values()})
    out["reissued"] = reissued
    api.flush()
    out["events"] = _rows("SELECT event, incarnation, host, reason FROM actors WHERE mesh = 'part' AND rank = 1 "
                          "ORDER BY ts")
    procs.stop()
    return out


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[-1].split()[0] not in ("Z", "X")
    except FileNotFoundError:
        return False


if __name__ == "__main__":
    result = {"apart": apart, "partition": partition}[sys.argv[1]]()
    print(json.dumps(result, default=str), flush=True)
    sys.stdout.flush()
