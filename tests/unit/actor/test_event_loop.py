"""RLMESH_EVENT_LOOP: the worker's loop is asyncio's unless uvloop is asked for; a bad value, or a
loop that is not installed, fails with the key and the fix rather than running on another loop."""

import asyncio
import importlib.util

import pytest

from rlmesh.actor.worker import EVENT_LOOP_ENV, new_event_loop


def _serves(loop: asyncio.AbstractEventLoop, package: str) -> None:
    try:
        assert type(loop).__module__.startswith(package)
        assert loop.run_until_complete(asyncio.sleep(0, result=7)) == 7
    finally:
        loop.close()


def test_default_is_asyncio(monkeypatch):
    monkeypatch.delenv(EVENT_LOOP_ENV, raising=False)
    _serves(new_event_loop(), "asyncio")


def test_uvloop_when_asked_or_a_clear_error_without_it(monkeypatch):
    monkeypatch.setenv(EVENT_LOOP_ENV, "uvloop")
    if importlib.util.find_spec("uvloop") is None:
        with pytest.raises(RuntimeError, match="RLMESH_EVENT_LOOP=uvloop but uvloop is not installed"):
            new_event_loop()
        return
    _serves(new_event_loop(), "uvloop")


def test_an_unknown_loop_names_the_key(monkeypatch):
    monkeypatch.setenv(EVENT_LOOP_ENV, "trio")
    with pytest.raises(ValueError, match="RLMESH_EVENT_LOOP='trio': use 'asyncio' or 'uvloop'"):
        new_event_loop()
