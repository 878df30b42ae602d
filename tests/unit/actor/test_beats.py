"""The shared-memory heartbeat board: slots, what the supervisor takes from it, and its cleanup."""

from __future__ import annotations

import os
import time
from types import SimpleNamespace

import pytest

from rlmesh.actor.beats import BOARD_ENV, BoardSlot, HeartbeatBoard
from rlmesh.actor.supervision import HeartbeatMonitor
from rlmesh.weights.slots import owner_pid


def _rec(state: str = "alive", pending: int = 0) -> SimpleNamespace:
    return SimpleNamespace(board_slot=None, last_hb=0.0, state=state, spawns_pending=pending, hb=HeartbeatMonitor())


@pytest.fixture
def board(tmp_path):
    b = HeartbeatBoard(str(tmp_path), "job/1")
    yield b
    b.close()


def test_a_worker_beat_reaches_its_record_and_only_newer_beats_of_live_procs_count(board, monkeypatch):
    live, stopped = _rec(), _rec(state="stopped")
    envs = [board.attach(live), board.attach(stopped)]
    assert [r.board_slot for r in (live, stopped)] == [0, 1]
    assert oct(os.stat(board.path).st_mode & 0o777) == "0o600"
    for env in envs:
        monkeypatch.setenv(BOARD_ENV, env)
        BoardSlot.from_env().beat()
    board.collect(("alive",))
    assert 0 < live.last_hb <= time.monotonic() and stopped.last_hb == 0.0
    live.last_hb = time.monotonic() + 100  # a hello after the beat: the older beat does not move it back
    board.collect(("alive",))
    assert live.last_hb > time.monotonic() + 50


def test_slots_are_kept_across_incarnations_and_reused_once_freed(board):
    a, b = _rec(), _rec()
    first = board.attach(a)
    assert board.attach(a) == first  # a restart keeps its slot
    board.detach(a)
    assert a.board_slot is None and not board.procs
    board.attach(b)
    assert b.board_slot == 0 and board.read() == [0.0]  # reused, and zeroed


def test_an_unusable_board_means_beating_by_message(tmp_path, monkeypatch):
    monkeypatch.setenv(BOARD_ENV, f"{tmp_path}/missing:3")
    assert BoardSlot.from_env() is None
    monkeypatch.delenv(BOARD_ENV)
    assert BoardSlot.from_env() is None
    monkeypatch.setenv("RLMESH_HB_BOARD_OFF", "1")
    assert HeartbeatBoard.create("job") is None


def test_the_board_is_named_for_reclaim_and_removed_on_close(tmp_path):
    b = HeartbeatBoard(str(tmp_path), "j")
    assert owner_pid(os.path.basename(b.path)) == os.getpid()  # a killed controller's board is reclaimed
    b.close()
    assert not os.path.exists(b.path)
