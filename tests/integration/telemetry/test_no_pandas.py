"""A run that records telemetry never imports pandas, in the controller or in a worker: pyarrow's
conversions of Python objects import it (0.25 s of CPU and ~48 MB a process, and once on the
start-up template's critical path), so telemetry builds its arrays from buffers instead, and the
service answers a closing sink's "acked" query the same way (it cost every stop 0.3 s)."""

from fresh_controller import run_controller_script

SCRIPT = """
import sys
import time
import rlmesh as rm

class Probe(rm.Actor):
    @rm.endpoint
    async def work(self, i: int) -> bool:
        rm.telemetry.record("probe", step=i, loss=0.5 * i, ok=i % 2 == 0, note=None if i else "first")
        return "pandas" in sys.modules

    @rm.endpoint
    async def imported(self) -> bool:
        return "pandas" in sys.modules

procs = rm.this_host().spawn_procs(per_host={"procs": 2})
probe = procs.spawn("probe", Probe)
for i in range(3):
    assert not any(probe.work.call(i).get(timeout=60).values())
rm.telemetry.record("controller_probe", x=1)
rm.telemetry.flush()
deadline = time.monotonic() + 60
while True:  # the workers' rows arrive at their next flush
    try:
        if rm.telemetry.query("SELECT count(*) FROM probe").column(0)[0].as_py() == 6:
            break
    except Exception:
        pass  # the table does not exist before the first batch lands
    assert time.monotonic() < deadline, "the workers' rows never landed"
    time.sleep(0.1)
assert not any(probe.imported.call().get(timeout=60).values()), "a worker imported pandas"
procs.stop()
print("controller pandas:", "pandas" in sys.modules)
"""


def test_a_recording_run_imports_pandas_nowhere(tmp_path):
    out = run_controller_script(SCRIPT, tmp_path, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "controller pandas: False" in out.stdout, out.stdout + out.stderr[-2000:]
