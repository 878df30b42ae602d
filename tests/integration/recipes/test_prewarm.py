"""``rlmesh run`` starts the procs' start-up template before it imports Hydra, and the run uses it.

The early start only pays if the template's environment still matches when the recipe spawns its
procs: a mismatch (a variable that importing the recipe's modules sets, as gymnasium sets
``PYGAME_HIDE_SUPPORT_PROMPT``) would start a second template and import torch twice.
"""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]

SCRIPT = """
import json, sys
import rlmesh.launch.starters as starters
import rlmesh.recipes.cli as cli
from rlmesh.cli import main
calls = []
prewarm = cli.prewarm
cli.prewarm = lambda *a, **k: (calls.append({"hydra imported": "hydra" in sys.modules}), prewarm(*a, **k))[1]
sys.argv = ["rlmesh", "run", "recipe=ppo_cartpole", "trainer.total_steps=2048", "eval.every=0", "run.progress=false"]
rc = main()
print("RESULT " + json.dumps({"rc": rc, "calls": calls, "starters": [s.name for s in starters.STARTERS.values()],
                              "forked": sorted(len(s._pids) for s in starters.STARTERS.values())}))
"""


@pytest.mark.timeout(300)
def test_the_template_started_before_hydra_is_the_one_the_recipe_forks_from(tmp_path):
    env = {**os.environ, "RLMESH_RUNS_DIR": str(tmp_path / "runs"), "PYTHONPATH": str(ROOT)}
    env.pop("RLMESH_JOB_ID", None)
    env.pop("RLMESH_SECRET", None)
    out = subprocess.run([sys.executable, "-c", SCRIPT], cwd=tmp_path, env=env, capture_output=True, text=True,
                         timeout=280)
    line = [ln for ln in out.stdout.splitlines() if ln.startswith("RESULT ")]
    assert out.returncode == 0 and line, out.stderr[-3000:]
    r = json.loads(line[-1][len("RESULT "):])
    assert r["rc"] == 0
    assert r["calls"] == [{"hydra imported": False}], r  # started before Hydra was imported, so before composing
    assert r["starters"] == ["starter0"], r  # one template: the early one matched the recipe's procs
    assert r["forked"][0] >= 3, r  # every proc of the recipe's mesh was forked from it


CHECK_ONLY = """
import sys
import rlmesh.rl.run.placement as placement
placement._import_quietly = lambda module, name: None  # without the background import: what does the check itself load?
from rlmesh.recipes import compose_recipe
for recipe in ("ppo_cartpole", "td3_pendulum", "dqn_cartpole"):
    cfg, _ = compose_recipe([f"recipe={recipe}"])
    for key in ("generator", "trainer", "buffer"):
        placement.check_target(getattr(cfg, key), key)
print("TORCH", "torch" in sys.modules)
"""


@pytest.mark.timeout(120)
def test_checking_the_shipped_recipes_actor_classes_imports_no_torch(tmp_path):
    """What lets the controller import torch while its procs start: the check before any proc starts
    reads the algorithms' sources and the lazy ``rlmesh.rl.actors``, and runs none of them."""
    out = subprocess.run([sys.executable, "-c", CHECK_ONLY], cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         capture_output=True, text=True, timeout=110)
    assert out.returncode == 0 and "TORCH False" in out.stdout, out.stdout[-1000:] + out.stderr[-3000:]
