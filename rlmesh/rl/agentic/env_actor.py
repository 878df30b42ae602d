"""Environments as actors: :class:`EnvActor` holds the environments of many episodes in its own
proc (the ``env`` mesh), and the two :class:`~rlmesh.rl.agentic.episodes.EnvClient` s reach them.

Why a mesh of their own: a tool that hangs or eats memory, or an environment that crashes its
proc, must never take a generator down. The env procs are supervised like every other proc: one
that dies is restarted, and every episode it held fails with ``ActorDied`` at its generator, whose
work item the controller re-issues under the same id (``rlmesh.rl.run.resilience.serve_work``).

Endpoints are ``async`` and step the environments on a thread pool, so one env actor serves
many episodes' tools at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import importlib
import zlib
from typing import Any, Callable

import rlmesh as rm
from rlmesh.rl.agentic.protocol import StepResult, TextEnv


def env_factory(env: type[TextEnv] | str, kwargs: dict[str, Any] | None = None) -> Callable[[], TextEnv]:
    """A constructor of fresh environments from a class or a ``"module:Class"`` path."""
    if isinstance(env, str):
        mod, _, name = env.partition(":")
        try:
            env = getattr(importlib.import_module(mod), name)
        except (ImportError, AttributeError) as exc:
            raise ValueError(f"env.cls={env!r} cannot be imported ({exc}); use 'package.module:ClassName'") from exc
    cls, kw = env, dict(kwargs or {})
    return lambda: cls(**kw)  # type: ignore[operator]


class EpisodeLost(rm.ActorError):
    """A step for an episode this env actor does not hold (its proc was replaced since the reset)."""


class EnvActor(rm.Actor):
    """Many episodes' environments, keyed by episode id.

    Args:
        env: the :class:`~rlmesh.rl.agentic.protocol.TextEnv` subclass (or ``"module:Class"``).
        env_kwargs: its constructor's arguments (one instance per episode).
        max_workers: environments stepped at once (tools running concurrently).
    """

    def __init__(self, env: type[TextEnv] | str, env_kwargs: dict[str, Any] | None = None,
                 max_workers: int = 32) -> None:
        self.make = env_factory(env, env_kwargs)
        self.envs: dict[str, TextEnv] = {}
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="env")

    async def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await asyncio.get_running_loop().run_in_executor(self.pool, fn, *args)

    @rm.endpoint
    async def reset(self, episode_id: str, task: Any) -> str:
        """A fresh environment for ``episode_id`` (replacing one a re-issued episode left) and its first observation."""
        old = self.envs.pop(episode_id, None)
        if old is not None:
            await self._run(old.close)
        env = self.envs[episode_id] = self.make()
        return await self._run(env.reset, task)

    @rm.endpoint
    async def step(self, episode_id: str, text: str) -> StepResult:
        env = self.envs.get(episode_id)
        if env is None:
            ctx = rm.context()
            raise EpisodeLost(f"episode {episode_id!r} is not held by env[{ctx.rank}] (its proc was replaced "
                              "since the reset); the episode must be re-issued", mesh=ctx.mesh_name, rank=ctx.rank,
                              endpoint="step")
        return await self._run(env.step, text)

    @rm.endpoint
    def close(self, episode_id: str) -> None:
        """Drop an episode's environment (on the actor's thread: cheap, and never cut short at stop)."""
        env = self.envs.pop(episode_id, None)
        if env is not None:
            env.close()

    @rm.endpoint
    def open_episodes(self) -> list[str]:
        """Episode ids this actor holds (tests, debugging)."""
        return sorted(self.envs)

    def on_stop(self) -> None:
        for env in self.envs.values():
            env.close()
        self.pool.shutdown(wait=False, cancel_futures=True)


class LocalEnvClient:
    """Environments in this process, stepped on a thread pool: the single-process loop and tests."""

    def __init__(self, env: type[TextEnv] | str | Callable[[], TextEnv], env_kwargs: dict[str, Any] | None = None,
                 max_workers: int = 32) -> None:
        self.make = env_factory(env, env_kwargs) if isinstance(env, (str, type)) else env
        self.envs: dict[str, TextEnv] = {}
        self.pool = concurrent.futures.ThreadPoolExecutor(max_workers, thread_name_prefix="env")

    def reset(self, episode_id: str, task: Any) -> concurrent.futures.Future:
        env = self.envs[episode_id] = self.make()
        return self.pool.submit(env.reset, task)

    def step(self, episode_id: str, text: str) -> concurrent.futures.Future:
        return self.pool.submit(self.envs[episode_id].step, text)

    def close(self, episode_id: str) -> None:
        env = self.envs.pop(episode_id, None)
        if env is not None:
            self.pool.submit(env.close)

    def shutdown(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


class MeshEnvClient:
    """Environments on an ``EnvActor`` mesh (spawned over a ``procs`` dimension, or one actor): each
    episode lives on one rank, a stable hash of its id."""

    def __init__(self, mesh: Any) -> None:
        self.mesh = mesh
        self.n = len(mesh)

    def rank_of(self, episode_id: str) -> int:
        return zlib.crc32(episode_id.encode()) % self.n

    def _one(self, episode_id: str) -> Any:
        # one actor (a mesh sliced to a single proc has no dimension left): it holds every episode
        return self.mesh if self.n == 1 else self.mesh.slice(procs=self.rank_of(episode_id))

    @staticmethod
    def _bridge(fut: Any) -> concurrent.futures.Future:
        out: concurrent.futures.Future = concurrent.futures.Future()

        def done(f: Any) -> None:
            try:
                out.set_result(f.get())
            except BaseException as exc:  # noqa: BLE001 - handed to the episode loop
                out.set_exception(exc)

        fut.add_done_callback(done)
        return out

    def reset(self, episode_id: str, task: Any) -> concurrent.futures.Future:
        return self._bridge(self._one(episode_id).reset.call_one(episode_id, task))

    def step(self, episode_id: str, text: str) -> concurrent.futures.Future:
        return self._bridge(self._one(episode_id).step.call_one(episode_id, text))

    def close(self, episode_id: str) -> None:
        self._one(episode_id).close.broadcast(episode_id)
