"""proc_health with real procs: every proc samples itself, rows name it, and a leaking proc is warned about.

The growth window is shrunk to 4 s (``RLMESH_RSS_GROWTH_WINDOW_S``) so that a proc leaking 30 MB/s
is caught within seconds; the leak goes on (up to 2 GB) until the warning is seen, so a slow
machine only makes the test longer, never wrong.
"""

import json

import pytest

from fresh_controller import run_controller_script

pytestmark = pytest.mark.timeout(400)

SCRIPT = """
import json, os, threading, time
os.environ.update({"RLMESH_PROC_HEALTH_INTERVAL": "0.2", "RLMESH_RSS_GROWTH_WINDOW_S": "4",
                   "RLMESH_RSS_GROWTH_MIN_MB": "24", "RLMESH_RSS_GROWTH_RATIO": "0.1"})
import psutil
import rlmesh as rm

class Probe(rm.Actor):
    def __init__(self):
        self.held, self.stop = [], threading.Event()

    @rm.endpoint
    def me(self) -> dict:
        return {"pid": os.getpid(), "rss": psutil.Process().memory_info().rss, "proc": rm.context().proc.proc_id}

    @rm.endpoint
    def leak(self, mb_per_s: float, cap_mb: int) -> None:
        def grow():  # mb_per_s of wall time: a thread starved on a busy host catches up when it runs
            t0 = time.monotonic()
            while not self.stop.is_set() and len(self.held) < cap_mb:
                while len(self.held) < min(cap_mb, mb_per_s * (time.monotonic() - t0)):
                    self.held.append(b"x" * (1 << 20))  # touched, so resident
                time.sleep(0.02)
        threading.Thread(target=grow, daemon=True).start()

    @rm.endpoint
    def free(self) -> int:
        self.stop.set()
        n, self.held = len(self.held), []
        return n

def rows(sql):
    try:
        return rm.telemetry.query(sql).to_pylist()
    except Exception:
        return []  # nothing recorded into the table yet

def wait_for(what, sql, ok, timeout=300):
    deadline = time.monotonic() + timeout
    while True:
        r = rows(sql)
        if ok(r):
            return r
        assert time.monotonic() < deadline, f"{what}: not within {timeout} s: {r}"
        time.sleep(0.2)

procs = rm.this_host().spawn_procs(per_host={"procs": 2})
probe = procs.spawn("probe", Probe)
steady, leaky = probe.slice(procs=0), probe.slice(procs=1)
me = {"steady": steady.me.call_one().get(timeout=120), "leaky": leaky.me.call_one().get(timeout=120)}
leaky.leak.call_one(30.0, 2000).get(timeout=120)
warned = wait_for("a growth warning on the leaky proc",
                  "SELECT proc, pid, rss, warning FROM proc_health WHERE warning IS NOT NULL", bool)
logged = wait_for("the warning's log line", "SELECT proc, level, message FROM logs "
                  "WHERE message LIKE '%RSS grows without bound%'", bool)
freed = leaky.free.call_one().get(timeout=120)
# every proc sampled itself at least a few times
per_proc = wait_for("rows from every proc", "SELECT mesh, rank, proc, host, count(*) AS n, list(DISTINCT pid) AS pids, "
                    "min(rss) AS min_rss, max(rss) AS max_rss, min(threads) AS threads, min(fds) AS fds, "
                    "count(warning) AS warnings FROM proc_health GROUP BY ALL ORDER BY proc",
                    lambda r: len(r) == 3 and all(x["n"] >= 3 for x in r))
now = {"steady": steady.me.call_one().get(timeout=120)}
procs.stop()
print("RESULT " + json.dumps({"me": me, "now": now, "warned": warned, "logged": logged, "freed": freed,
                              "per_proc": per_proc}, default=str))
"""


def test_every_proc_samples_itself_and_a_leak_is_warned_about(tmp_path):
    out = run_controller_script(SCRIPT, tmp_path, timeout=380)
    assert out.returncode == 0, out.stderr[-4000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, out.stdout[-2000:] + out.stderr[-3000:]
    r = json.loads(line[-1][len("RESULT "):])
    me, by_proc = r["me"], {p["proc"]: p for p in r["per_proc"]}
    steady, leaky = me["steady"]["proc"], me["leaky"]["proc"]
    assert set(by_proc) == {"controller", steady, leaky}
    ctl = by_proc["controller"]
    assert ctl["mesh"] == "controller" and ctl["rank"] == -1
    for who, rank in (("steady", 0), ("leaky", 1)):
        row = by_proc[me[who]["proc"]]
        assert row["rank"] == rank and row["pids"] == [me[who]["pid"]], row  # the row names the proc it describes
        assert row["threads"] >= 1 and row["fds"] >= 3
    s = by_proc[steady]  # its own reading lies within what it sampled of itself over the run
    assert s["min_rss"] * 0.8 <= me["steady"]["rss"] and r["now"]["steady"]["rss"] <= s["max_rss"] * 1.25, (s, r["now"])
    assert s["warnings"] == 0  # a flat proc is never warned about
    assert {w["proc"] for w in r["warned"]} == {leaky}, r["warned"]
    assert "MB/min" in r["warned"][0]["warning"]
    assert [(ln["proc"], ln["level"]) for ln in r["logged"]] == [(leaky, "WARNING")], r["logged"]
    assert r["freed"] > 24  # it did leak
