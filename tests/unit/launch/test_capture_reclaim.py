"""Capture folders made before the pid went into their name (``rlmesh-capture-<8 characters>``) are
reclaimed once abandoned: unchanged for an hour and no file in them open. Real folders, FIFOs and
/proc; no procs."""

import os
import time

from rlmesh.launch.capture import PIDLESS_IDLE_S, reclaim_dead_capture_dirs


def _folder(tmp, name: str, age_s: float) -> str:
    path = tmp / name
    path.mkdir(mode=0o700)
    os.mkfifo(path / "out")
    then = time.time() - age_s
    os.utime(path, (then, then))
    return str(path)


def test_an_abandoned_pidless_folder_goes_and_a_held_or_recent_one_stays(tmp_path):
    old = _folder(tmp_path, "rlmesh-capture-ab12cd34", PIDLESS_IDLE_S + 60)
    held = _folder(tmp_path, "rlmesh-capture-ef56gh78", PIDLESS_IDLE_S + 60)
    recent = _folder(tmp_path, "rlmesh-capture-ij90kl12", 60)
    other = _folder(tmp_path, "rlmesh-capture-notours", PIDLESS_IDLE_S + 60)  # 7 characters: not mkdtemp's
    fd = os.open(os.path.join(held, "out"), os.O_RDWR | os.O_NONBLOCK)  # a live controller reads its FIFOs
    try:
        assert reclaim_dead_capture_dirs(str(tmp_path)) == [old]
    finally:
        os.close(fd)
    assert not os.path.exists(old)
    assert all(os.path.isdir(p) for p in (held, recent, other))
    assert reclaim_dead_capture_dirs(str(tmp_path)) == [held]  # let go of: abandoned now
