import pytest

import rlmesh.telemetry as tm
from rlmesh.telemetry import api

pytest.importorskip("matplotlib")


def test_plot_writes_a_png_with_curves(runs_dir, capsys):
    from rlmesh.telemetry.plot import plot_main

    for i in range(500):
        tm.record("rollouts", reward=i / 500, policy_version=i // 50)
        tm.record("train_steps", step=i, loss=1 / (1 + i))
    api.recorder().record_trusted("actors", {"event": "died", "proc": "procs.1", "signal": 9})
    run_id = tm.current_run()
    tm.end_run()
    assert plot_main([run_id]) == 0
    path = capsys.readouterr().out.strip()
    with open(path, "rb") as f:
        head = f.read(8)
    assert head == b"\x89PNG\r\n\x1a\n" and path.endswith(f"{run_id}/curves.png")


def test_plot_of_an_empty_run_still_renders(runs_dir, tmp_path):
    from rlmesh.telemetry.plot import plot_run

    tm.start_run()
    run_id = tm.current_run()
    tm.end_run()
    out = plot_run(run_id, tmp_path / "x.png")
    assert out.stat().st_size > 1000


def test_plot_overlays_a_sweeps_runs_on_one_env_steps_axis(runs_dir, tmp_path):
    from rlmesh.telemetry.plot import plot_main

    ids = []
    for k in range(2):
        for i in range(20):
            tm.record("rollouts", reward=float(i * (k + 1)), length=8, episodes=1, policy_version=i)
            tm.record("evals", step=i, policy_version=i, metric="mean_return", value=float(i), env_steps=8 * i)
        ids.append(tm.current_run())
        tm.end_run()
    out = tmp_path / "sweep.png"
    assert plot_main([*ids, "--out", str(out)]) == 0
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 20_000


def test_plot_panels_are_the_dashboards_charts_on_one_axis():
    from rlmesh.telemetry import charts

    panels = charts.plot_panels()
    assert [p.id for p in panels] == ["eval_env_steps", "reward_env_steps", "loss_env_steps"]
    assert {p.x_axis for p in panels} == {"env_steps"} and all(p.page == charts.Page.RUN for p in panels)
