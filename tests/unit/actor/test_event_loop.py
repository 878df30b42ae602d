"""RLMESH_EVENT_LOOP: the worker's loop is uvloop's where it is installed (a dependency but on Windows),
asyncio's when asked; a bad value, or a loop that is not installed, fails with the key and the fix
rather than running on another loop."""

import asyncio
import importlib.util
import sys

import pytest

from rlmesh.actor.worker import EVENT_LOOP_ENV, new_event_loop


def _serves(loop: asyncio.AbstractEventLoop, package: str) -> None:
    try:
        assert type(loop).__module__.startswith(package)
        assert loop.run_until_complete(asyncio.sleep(0, result=7)) == 7
    finally:
        loop.close()


def test_default_is_uvloop_where_installed(monkeypatch):
    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    if sys.platform != "win32":  # a dependency there: its absence is a broken install, not a fallback case
        assert importlib.util.find_spec("uvloop") is not None, "uvloop is a dependency of rlmesh on this platform"
    _serves(new_event_loop(), "uvloop" if importlib.util.find_spec("uvloop") else "asyncio")


def test_asyncio_when_asked(monkeypatch):
    monkeypatch.setenv(EVENT_LOOP_ENV, "asyncio")
    _serves(new_event_loop(), "asyncio")


def test_without_uvloop_the_default_is_asyncio_and_asking_for_it_says_the_fix(monkeypatch):
    from rlmesh.actor import worker

    monkeypatch.setattr(worker, "uvloop", None)
    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    _serves(new_event_loop(), "asyncio")
    monkeypatch.setenv(EVENT_LOOP_ENV, "uvloop")
    with pytest.raises(RuntimeError, match="RLMESH_EVENT_LOOP=uvloop but uvloop is not installed: pip install uvloop"):
        new_event_loop()


def test_uvloop_when_asked(monkeypatch):
    monkeypatch.setenv(EVENT_LOOP_ENV, "uvloop")
    _serves(new_event_loop(), "uvloop")


def test_an_unknown_loop_names_the_key(monkeypatch):
    monkeypatch.setenv(EVENT_LOOP_ENV, "trio")
    with pytest.raises(ValueError, match="RLMESH_EVENT_LOOP='trio': use 'asyncio' or 'uvloop'"):
        new_event_loop()
