"""resume=: finding the run, rebuilding its saved config with overrides on top, refusing what cannot resume."""

import json
import os
import socket

import pytest
from omegaconf import OmegaConf

from rlmesh.recipes.compose import RecipeConfigError, compose
from rlmesh.recipes.run_state import RECIPE_JSON, resume_config
from rlmesh.telemetry import run as runs
from rlmesh.telemetry.errors import RunNotFoundError


@pytest.fixture
def runs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("RLMESH_RUNS_DIR", str(tmp_path))
    return tmp_path


def make_run(root, run_id, recipe=True, status="crashed", pid=999_999):
    d = root / run_id
    d.mkdir()
    (d / runs.DB_NAME).write_bytes(b"")
    (d / runs.RUN_JSON).write_text(json.dumps({"id": run_id, "status": status, "pid": pid,
                                               "host": socket.gethostname()}))
    if recipe:
        cfg = OmegaConf.to_container(OmegaConf.structured(compose(["recipe=ppo_cartpole"])[0]))
        cfg["trainer"]["lr"] = 0.005
        (d / RECIPE_JSON).write_text(json.dumps({"program": "ppo", "launcher": "local", "generation": 0,
                                                  "config": OmegaConf.to_yaml(cfg)}))
    return d


def test_saved_config_with_overrides_on_top(runs_dir):
    make_run(runs_dir, "20260101-000000-aaaa")
    cfg, launcher = resume_config("20260101-000000-aaaa", ["recipe=ignored", "resume=x", "generator.replicas=3"])
    assert launcher == "local" and cfg.run.resume == "20260101-000000-aaaa"
    assert cfg.trainer.lr == 0.005 and cfg.generator.replicas == 3 and cfg.eval.target == 475.0


def test_latest_resolves_through_the_runs_dir(runs_dir):
    make_run(runs_dir, "20260101-000000-aaaa")
    make_run(runs_dir, "20260102-000000-bbbb")
    cfg, _ = resume_config("latest", [])
    assert cfg.run.resume == "20260102-000000-bbbb"


def test_unknown_runs_and_runs_without_a_recipe_are_config_errors(runs_dir):
    make_run(runs_dir, "20260101-000000-aaaa", recipe=False)
    with pytest.raises(RecipeConfigError, match="resume=nope: no telemetry run 'nope'.*recent runs: 20260101-000000-aaaa"):
        resume_config("nope", [])
    with pytest.raises(RecipeConfigError, match="has no recipe.json"):
        resume_config("20260101-000000-aaaa", [])


def test_bad_overrides_name_the_key(runs_dir):
    make_run(runs_dir, "20260101-000000-aaaa")
    with pytest.raises(RecipeConfigError, match="generator.replicas"):
        resume_config("20260101-000000-aaaa", ["generator.replicas=0"])


def test_a_run_whose_controller_is_alive_cannot_be_reopened(runs_dir):
    make_run(runs_dir, "20260101-000000-aaaa", status="running", pid=os.getpid())
    with pytest.raises(RunNotFoundError, match="still running"):
        runs.reopen_run_dir("20260101-000000-aaaa", runs_dir)
    make_run(runs_dir, "20260101-000000-bbbb", status="running")          # its pid is gone: crashed
    assert runs.reopen_run_dir("20260101-000000-bbbb", runs_dir) == runs_dir / "20260101-000000-bbbb"
    assert (runs_dir / "latest").resolve() == (runs_dir / "20260101-000000-bbbb").resolve()


def test_a_copied_run_resumes_the_copy_not_the_original(runs_dir, tmp_path):
    """Issue 11 item 12: the saved config kept telemetry.runs_dir and trainer.checkpoint_dir absolute,
    so resuming a copy appended to the ORIGINAL run's database and checkpoints."""
    orig_root = tmp_path / "original"
    orig_root.mkdir()
    d = make_run(orig_root, "20260101-000000-aaaa")
    saved = json.loads((d / RECIPE_JSON).read_text())
    cfg = OmegaConf.create(saved["config"])
    cfg.telemetry.runs_dir = str(orig_root)                           # what an absolute runs_dir saved looks like
    cfg.trainer.checkpoint_dir = str(d / "checkpoints")              # the default begin() filled in
    saved["config"] = OmegaConf.to_yaml(cfg)
    (d / RECIPE_JSON).write_text(json.dumps(saved))
    import shutil

    shutil.copytree(d, runs_dir / d.name)                            # RLMESH_RUNS_DIR points at the copy's root
    got, _ = resume_config("latest", [])
    assert got.telemetry.runs_dir == str(runs_dir)
    assert got.trainer.checkpoint_dir == str(runs_dir / d.name / "checkpoints")
    mine, _ = resume_config("latest", ["trainer.checkpoint_dir=/somewhere/else"])
    assert mine.trainer.checkpoint_dir == "/somewhere/else"          # an explicit choice is kept


def test_a_renamed_copy_of_a_run_resumes_into_its_own_checkpoints(runs_dir, tmp_path):
    """A copy under another name kept the original's checkpoint folder in its saved config, and a
    resume of it wrote into the ORIGINAL run's checkpoints."""
    orig_root = tmp_path / "original"
    orig_root.mkdir()
    d = make_run(orig_root, "20260101-000000-aaaa")
    saved = json.loads((d / RECIPE_JSON).read_text())
    cfg = OmegaConf.create(saved["config"])
    cfg.trainer.checkpoint_dir = str(d / "checkpoints")              # the default begin() filled in
    saved["config"] = OmegaConf.to_yaml(cfg)
    (d / RECIPE_JSON).write_text(json.dumps(saved))
    import shutil

    shutil.copytree(d, runs_dir / "20260101-000000-copy")            # its run.json still says aaaa
    got, _ = resume_config("20260101-000000-copy", [])
    assert got.run.resume == "20260101-000000-copy"
    assert got.trainer.checkpoint_dir == str(runs_dir / "20260101-000000-copy" / "checkpoints")


def test_a_finished_run_resumes_only_with_a_larger_budget(runs_dir):
    """Issue 11 item 15: resume of a run that finished silently trained more."""
    make_run(runs_dir, "20260101-000000-aaaa", status="ok")
    budget = compose(["recipe=ppo_cartpole"])[0].trainer.total_steps
    with pytest.raises(RecipeConfigError, match=f"already finished.*trainer.total_steps={budget}.*larger budget"):
        resume_config("latest", [])
    with pytest.raises(RecipeConfigError, match="already finished"):
        resume_config("latest", [f"trainer.total_steps={budget}"])   # not larger
    cfg, _ = resume_config("latest", [f"trainer.total_steps={budget * 2}"])
    assert cfg.trainer.total_steps == budget * 2
    make_run(runs_dir, "20260101-000001-bbbb", status="interrupted")  # a stopped run continues as before
    assert resume_config("latest", [])[0].run.resume == "20260101-000001-bbbb"
