"""Live code changes and editable installs, with real procs: edit a reward function, sync with reload,
the next call runs the new code; an editable install's package reaches a simulated host."""

import json
import sys

import pytest

import rlmesh as rm
from rlmesh.workspace import ReloadMode, editable_roots, sync_workspace

SCORING = "def score(x):\n    return x + {}\n"
ACTORS = """import rlmesh as rm
from wsreload.scoring import score


class Scorer(rm.Actor):
    @rm.endpoint
    def score(self, x):
        return score(x) * {}
"""


@pytest.mark.timeout(180)
def test_edit_reward_function_then_sync_with_reload(tmp_path, monkeypatch):
    src = tmp_path / "proj"
    (src / "wsreload").mkdir(parents=True)
    (src / "wsreload" / "__init__.py").write_text("")
    (src / "wsreload" / "scoring.py").write_text(SCORING.format(1))
    (src / "wsreload" / "actors.py").write_text(ACTORS.format(1))
    monkeypatch.syspath_prepend(str(src))
    # a fresh Python per restart: cheaper here than warm templates that preload torch (the template's
    # side, dropping its copies of the tree's modules, is tests/unit/launch/test_fresh_imports.py)
    monkeypatch.setenv("RLMESH_FORKSERVER", "0")
    from wsreload.actors import Scorer

    with rm.this_host().spawn_procs(per_host={"procs": 2}, restart=rm.Restart(max_restarts=3)) as procs:
        sync_workspace(procs, str(src), editable=False)
        scorers = procs.spawn("scorer", Scorer)
        assert scorers.score.call(1).get().values() == [2, 2]

        (src / "wsreload" / "scoring.py").write_text(SCORING.format(100))  # a pure function module: in place
        (row,) = sync_workspace(procs, str(src), editable=False, reload=True)
        assert [(r.reloaded, r.unsafe, r.restarted) for r in row.reloads] == [(["wsreload.scoring"], [], False)] * 2
        assert scorers.score.call(1).get().values() == [101, 101]  # `from ... import score` was re-pointed

        (src / "wsreload" / "actors.py").write_text(ACTORS.format(2))  # defines an actor class: restart
        (row,) = sync_workspace(procs, str(src), editable=False, reload=ReloadMode.AUTO)
        assert [(r.unsafe, r.restarted) for r in row.reloads] == [(["wsreload.actors"], True)] * 2
        assert procs.incarnations() == [1, 1]  # sync_workspace returned once the replacements serve
        assert scorers.score.call(1).get().values() == [202, 202]


class EditableProbe(rm.Actor):
    @rm.endpoint
    def where(self) -> str:
        import wsedit  # installed "editable" on the controller only

        return f"{wsedit.VALUE}@{wsedit.__file__}"


@pytest.mark.timeout(120)
def test_editable_install_reaches_a_simulated_host(tmp_path, monkeypatch):
    proj, site, work = tmp_path / "wsedit-proj", tmp_path / "site", tmp_path / "work"
    (proj / "src" / "wsedit").mkdir(parents=True)
    (proj / "src" / "wsedit" / "__init__.py").write_text("VALUE = 'from-editable'\n")
    info = site / "wsedit-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: wsedit\nVersion: 0.1\n")
    (info / "top_level.txt").write_text("wsedit\n")
    (info / "direct_url.json").write_text(json.dumps({"url": f"file://{proj}", "dir_info": {"editable": True}}))
    work.mkdir()
    with rm.this_host().spawn_procs(per_host={"procs": 2}) as procs:
        # after the procs started: they do not inherit these paths, as a remote host would not
        monkeypatch.syspath_prepend(str(site))
        monkeypatch.syspath_prepend(str(proj / "src"))  # what the install's .pth does on the controller
        assert [e.root for e in editable_roots() if e.dist == "wsedit"] == [str(proj / "src")]
        rows = sync_workspace(procs, str(work), store_dir=str(tmp_path / "stores"), dest_root=str(tmp_path / "hosts"),
                              simulate_hosts=True)
        got = procs.spawn("probe", EditableProbe).where.call().get().values()
        for i, v in enumerate(got):
            assert v == f"from-editable@{tmp_path}/hosts/host-{i}/{rows[i].dest.rsplit('/', 1)[1]}" \
                        "/.rlmesh-editable/wsedit/wsedit/__init__.py", v
        assert "wsedit" not in sys.modules  # the controller never imported it: the file came through the sync
