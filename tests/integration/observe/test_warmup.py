"""Warm-up phases inside actors' __init__ (GRPO's SFT, engine start) show their own progress while spawn waits."""

import io
import json

import pytest

import rlmesh as rm
from obs_actors import WarmingUp
from rlmesh.rl.run.warmup import WarmupDisplay, phase_status
from rlmesh.telemetry import api, introspect

pytestmark = pytest.mark.timeout(120)


class _SeenRunning(io.StringIO):
    """The display's output; touches ``flag`` once a line shows the SFT phase part done (the actors wait for it)."""

    def __init__(self, flag):
        super().__init__()
        self.flag = flag

    def write(self, text):
        for line in text.splitlines():
            w = json.loads(line)["warmup"]
            if w["phase"] == "learner: SFT warm start" and 0 < w["completed"] < (w["total"] or 0):
                self.flag.touch()
        return super().write(text)


# serial: a fresh controller process. In a pytest-xdist worker whose earlier files ended a run, procs
# spawned later still reported to the ended run's service ("Limits, honestly" in docs/telemetry.md)
@pytest.mark.serial
def test_warm_up_phases_in_actors_show_their_progress_while_spawn_waits(monkeypatch, tmp_path):
    """Real procs record `phases` rows; the controller's display, piped, prints them as JSON lines."""
    monkeypatch.setenv("RLMESH_PROGRESS", "json")
    monkeypatch.setenv("RLMESH_PROGRESS_EVERY_S", "0")  # a line at every poll that finds the phase running
    rm.telemetry.start_run(runs_dir=tmp_path / "runs")  # this process's first run (the test runs serial)
    flag = tmp_path / "seen-running"
    out = _SeenRunning(flag)
    with rm.this_host().spawn_procs(per_host={"procs": 2}, name="warm") as procs:
        with WarmupDisplay(rm.telemetry.query, stream=out, poll_s=0.2) as display:
            actors = procs.spawn("learner", WarmingUp, 10, 0.2, str(flag))  # blocks until both __init__ finished
        assert actors.ping.call().get() is not None
    docs = [json.loads(line)["warmup"] for line in out.getvalue().splitlines()]
    sft = [d for d in docs if d["phase"] == "learner: SFT warm start"]
    assert sft, out.getvalue()
    assert sft[-1] == {"phase": "learner: SFT warm start", "ranks": 2, "ranks_done": 2, "failed": 0,
                       "completed": 20, "total": 20, "unit": "steps", "elapsed_s": sft[-1]["elapsed_s"]}
    assert flag.exists() and any(0 < d["completed"] < 20 for d in sft), docs  # seen while running
    assert [d["ranks_done"] for d in docs if d["phase"] == "learner: engine start"][-1:] == [2]
    final = {s.key: s for s in display.seen}
    assert final["learner: SFT warm start"].finished and final["learner: engine start"].total is None
    assert [s.key for s in phase_status(rm.telemetry.query, 0) if s.mesh == "learner"] == [
        "learner: SFT warm start", "learner: engine start"]  # in the order they started
    status = introspect.run_status(api.current_run_dir())["warmup"]  # what MCP's run_status answers
    assert [(w["mesh"], w["phase"], w["ranks_done"], w["completed"], w["total"]) for w in status
            if w["mesh"] == "learner"] == [
        ("learner", "SFT warm start", 2, 20, 20), ("learner", "engine start", 2, 0, None)]
