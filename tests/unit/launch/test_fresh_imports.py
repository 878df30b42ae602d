"""A child forked from a warm template drops the template's modules of a synced workspace (RLMESH_FRESH_IMPORTS),
so it imports today's files; rlmesh's own modules stay even when the workspace is an rlmesh checkout."""

import sys
import types

from rlmesh.launch.fork_template import _forget_modules_under


def test_modules_under_fresh_folders_are_dropped_rlmesh_kept(tmp_path, monkeypatch):
    (tmp_path / "ws").mkdir()
    user = types.ModuleType("wsfresh_user")
    user.__file__ = str(tmp_path / "ws" / "wsfresh_user.py")
    elsewhere = types.ModuleType("wsfresh_other")
    elsewhere.__file__ = str(tmp_path / "other.py")
    ours = types.ModuleType("rlmesh.wsfresh_fake")
    ours.__file__ = str(tmp_path / "ws" / "rlmesh" / "wsfresh_fake.py")
    for m in (user, elsewhere, ours):
        monkeypatch.setitem(sys.modules, m.__name__, m)
    _forget_modules_under([str(tmp_path / "ws")])
    assert "wsfresh_user" not in sys.modules
    assert sys.modules["wsfresh_other"] is elsewhere and sys.modules["rlmesh.wsfresh_fake"] is ours
    _forget_modules_under([])  # nothing synced: nothing dropped
    assert sys.modules["wsfresh_other"] is elsewhere
