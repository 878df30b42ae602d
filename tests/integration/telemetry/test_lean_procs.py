"""A proc that records little never loads pyarrow or numpy, and its rows land as a busy proc's do.

Why it matters: pyarrow (with numpy) is ~0.1 s of CPU and tens of MB a process. A proc's small
flushes go to the service as plain rows (``RawRows``), which the service converts with the
function the proc would have used; a flush above ``RAW_MAX_ROWS`` rows is converted in the proc.
Both paths must give the same table, value for value.
"""

import json

from fresh_controller import run_controller_script

SCRIPT = """
import datetime, json, sys, time
import rlmesh as rm
from rlmesh.telemetry import api

HEAVY = ("pyarrow", "numpy", "duckdb")

def row(i):
    return {"step": i, "loss": 0.25 * i, "ok": i % 2 == 0, "note": None if i % 3 else f"n{i}",
            "meta": {"i": i, "tags": ["a", "b"]}, "blob": bytes([i % 256]),
            "stamp": datetime.datetime(2026, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(seconds=i)}

class Recorder(rm.Actor):
    @rm.endpoint
    async def record(self, table: str, n: int) -> list:
        for i in range(n):
            rm.telemetry.record(table, **row(i))
        rm.telemetry.flush()
        return [m for m in HEAVY if m in sys.modules]

    @rm.endpoint
    async def loaded(self) -> list:
        return [m for m in HEAVY if m in sys.modules]

procs = rm.this_host().spawn_procs(per_host={"procs": 2})
rec = procs.spawn("rec", Recorder)
quiet, busy = rec.slice(procs=0), rec.slice(procs=1)
out = {"quiet_after_record": quiet.record.call("few", 5).get(timeout=60).values()[0],
       "busy_after_record": busy.record.call("many", api.RAW_MAX_ROWS + 50).get(timeout=60).values()[0]}
deadline = time.monotonic() + 60
cols = "step, loss, ok, note, meta, blob, epoch_us(stamp) AS stamp, mesh, rank, proc"
while True:
    try:
        n_few = rm.telemetry.query("SELECT count(*) FROM few").column(0)[0].as_py()
        n_many = rm.telemetry.query("SELECT count(*) FROM many").column(0)[0].as_py()
        if (n_few, n_many) == (5, api.RAW_MAX_ROWS + 50):
            break
    except Exception:
        pass  # a table does not exist before its first batch lands
    assert time.monotonic() < deadline, "the rows never landed"
    time.sleep(0.1)
few = rm.telemetry.query(f"SELECT {cols} FROM few ORDER BY step").to_pylist()
many = rm.telemetry.query(f"SELECT {cols} FROM many WHERE step < 5 ORDER BY step").to_pylist()
types = {t: rm.telemetry.query(
    f"SELECT column_name, data_type FROM information_schema.columns WHERE table_name = '{t}' "
    "ORDER BY column_name").to_pylist() for t in ("few", "many")}
out["quiet_at_end"] = quiet.loaded.call().get(timeout=60).values()[0]
procs.stop()
for r in few + many:
    r["blob"] = r["blob"].hex()
out.update(few=few, many=many, types=types)
print("RESULT " + json.dumps(out, default=str))
"""


def test_a_proc_that_records_little_loads_no_pyarrow_and_its_rows_match_a_busy_procs(tmp_path):
    out = run_controller_script(SCRIPT, tmp_path, timeout=240)
    assert out.returncode == 0, out.stderr[-3000:]
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert line, out.stdout + out.stderr[-2000:]
    r = json.loads(line[-1][len("RESULT "):])
    assert r["quiet_after_record"] == [] and r["quiet_at_end"] == [], r  # its flushes shipped plain rows
    assert "pyarrow" in r["busy_after_record"], r  # a big flush is converted in the proc itself
    assert len(r["few"]) == len(r["many"]) == 5
    for a, b in zip(r["few"], r["many"]):  # the same values, converted by the service or by the proc
        assert {k: v for k, v in a.items() if k not in ("rank", "proc")} == \
               {k: v for k, v in b.items() if k not in ("rank", "proc")}
    assert r["few"][0]["note"] == "n0" and r["few"][1]["note"] is None and r["few"][2]["ok"] is True
    meta = r["few"][4]["meta"]
    assert (json.loads(meta) if isinstance(meta, str) else meta) == {"i": 4, "tags": ["a", "b"]}
    assert r["few"][0]["rank"] == 0 and r["many"][0]["rank"] == 1  # each row says which proc wrote it
    assert r["types"]["few"] == r["types"]["many"], r["types"]
