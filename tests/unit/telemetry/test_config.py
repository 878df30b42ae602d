import os

import pytest

from rlmesh.telemetry.config import TelemetryConfig, TelemetryConfigError, flush_interval_from_env


def test_defaults_match_the_documented_env():
    env = TelemetryConfig().env()
    assert env["RLMESH_TELEMETRY_FLUSH_S"] == "0.2" and env["RLMESH_SPANS"] == "1"


@pytest.mark.parametrize("kw,setting", [
    ({"flush_interval_s": 2.0}, "flush_interval_s"), ({"health_interval_s": -1}, "health_interval_s"),
    ({"proc_health_interval_s": -5}, "proc_health_interval_s"), ({"spans_max_per_s": 0}, "spans_max_per_s"), ({"runs_dir": ""}, "runs_dir"),
])
def test_bad_values_name_the_setting(kw, setting):
    with pytest.raises(TelemetryConfigError, match=f"telemetry.{setting}"):
        TelemetryConfig(**kw)


def test_apply_reaches_the_recorder(monkeypatch, tmp_path):
    for k in TelemetryConfig().env():  # monkeypatch remembers the originals and restores them
        monkeypatch.setenv(k, "placeholder")
    TelemetryConfig(flush_interval_s=0.5, spans=False, runs_dir=str(tmp_path)).apply()
    assert os.environ["RLMESH_SPANS"] == "0"
    assert flush_interval_from_env() == 0.5
    from rlmesh.telemetry.recorder import Recorder

    r = Recorder("x", lambda b: None)
    assert r.flush_interval == 0.5
    r.close()
