"""``SlurmLauncher``: the controller's ``Launcher`` for job steps.

``launch()`` runs on the controller's supervisor thread, so it only makes a :class:`StepHandle` and
queues the ``srun`` on a small pool; a step that cannot start comes back through ``poll()`` like any
death. Where a proc goes: its mesh's layout (ranks to nodes, fixed at ``spawn_procs``) for a first
start; a replacement goes back to its node when that node is still usable, else to the usable node
of the job with the fewest of the run's live steps. "Usable" is Slurm's view (not down, draining or
failing) and the node's own answer: its slurmd must accept a connection, because slurmctld notices a
lost node only after ``SlurmdTimeout``.
"""

from __future__ import annotations

import concurrent.futures
import datetime
import logging
import os
import signal
import subprocess
import sys
import threading
from typing import Any, Callable

from rlmesh import settings
from rlmesh.actor.controller import Controller, LaunchRequest
from rlmesh.launch import starters
from rlmesh.launch.output import ProcMeta
from rlmesh.launch.slurm.allocation import Allocation, SlurmError, run
from rlmesh.launch.slurm.commands import JobState, NodeInfo, srun_argv
from rlmesh.launch.slurm.config import SlurmConfig
from rlmesh.launch.slurm.steps import KILL_WAIT_S, StepHandle
from rlmesh.launch.slurm.worker_plugin import PLUGIN

logger = logging.getLogger(__name__)

NODE_PROBE_S = 0.5
"""How often the nodes with live steps are asked whether their slurmd answers."""
NODE_MISSES = 2
"""Probes in a row a node may miss before it is a lost host (one miss can be a busy node)."""


class SlurmLauncher:
    """``Launcher`` for the controller: ``launch(req)`` returns a :class:`StepHandle` at once."""

    def __init__(self, config: SlurmConfig, alloc: Allocation, on_job_ending: Callable[[str], None] | None = None):
        self.config = config
        self.alloc = alloc
        self.python = config.python or sys.executable
        self.layouts: dict[str, list[str]] = {}  # proc mesh -> node name of each rank
        self.gpus: dict[str, int] = {}  # proc mesh -> GPUs per task
        self.nodes: dict[str, NodeInfo] = {}  # what Slurm last said of each node of the job
        self.lost: set[str] = set()  # nodes found not answering (logged once each)
        self.handles: dict[str, StepHandle] = {}  # step name -> live step
        self.on_job_ending = on_job_ending or _stop_this_process
        self.job_ending = False
        self.closed = False
        self._lock = threading.RLock()  # a handle's poll() under it may call step_finished, which takes it too
        self._pool = concurrent.futures.ThreadPoolExecutor(4, thread_name_prefix="rlmesh-slurm")
        self._stop = threading.Event()
        self._watcher: threading.Thread | None = None

    # ------------------------------------------------------------------ layout (caller's thread)
    def refresh_nodes(self) -> list[NodeInfo]:
        """The job's nodes as Slurm sees them now (and remember their addresses)."""
        nodes = self.alloc.nodes()
        with self._lock:
            self.nodes.update({n.name: n for n in nodes})
        return nodes

    def set_layout(self, proc_mesh: str, nodes: list[str], gpus: int) -> None:
        self.layouts[proc_mesh] = list(nodes)
        self.gpus[proc_mesh] = gpus

    # ------------------------------------------------------------------ Launcher (supervisor thread)
    def launch(self, req: LaunchRequest) -> StepHandle:
        if self.closed:
            raise SlurmError("this SlurmCluster is closed; create a new one")
        name = f"{self.config.job_name}.{req.proc_id}.{req.incarnation}"
        handle = StepHandle(self, ProcMeta(req.proc_id, req.proc_mesh, req.rank, req.incarnation, ""), name)
        with self._lock:
            self.handles[name] = handle
            if self._watcher is None:
                self._watcher = threading.Thread(target=self._watch_nodes, name="rlmesh-slurm-nodes", daemon=True)
                self._watcher.start()
        self.submit(self._start, handle, req)
        return handle

    def _watch_nodes(self) -> None:
        """Ask each node that runs live steps whether its slurmd answers; a node that misses
        ``NODE_MISSES`` probes in a row is a lost host, and its steps are dead procs at once.

        Why not wait for heartbeats: their silence is judged against the host's load (up to 6x the
        floor on a busy controller host: 9 s), and Slurm itself marks the node only after
        ``SlurmdTimeout``. A refused connection says the host is gone within a second."""
        misses: dict[str, int] = {}
        while not self._stop.wait(NODE_PROBE_S):
            try:
                self._probe_nodes(misses)
            except Exception:  # noqa: BLE001 - the watch must outlive any one bad round
                logger.exception("probing the Slurm nodes failed; probing again in %.1f s", NODE_PROBE_S)

    def _probe_nodes(self, misses: dict[str, int]) -> None:
        """One round of :meth:`_watch_nodes`."""
        with self._lock:
            live: dict[str, list[StepHandle]] = {}
            for h in list(self.handles.values()):  # poll() may end a step, which removes it from the dict
                if h.popen is not None and h.poll() is None:
                    live.setdefault(h.node, []).append(h)
            nodes = {name: self.nodes.get(name) for name in live}
        for name, info in nodes.items():
            if info is None or self.alloc.answers(info, timeout=1.0):
                misses.pop(name, None)
                continue
            misses[name] = misses.get(name, 0) + 1
            if misses[name] < NODE_MISSES:
                continue
            if name not in self.lost:
                self.lost.add(name)
                logger.warning("Slurm node %s (%s) does not answer: a lost host; its procs restart elsewhere",
                               name, info.addr)
            for h in live[name]:
                h.lose(f"Slurm node {name} lost: its slurmd ({info.addr}) does not answer")

    def _start(self, handle: StepHandle, req: LaunchRequest) -> None:
        try:
            self._start_step(handle, req)
        except Exception as exc:  # noqa: BLE001 - a step that cannot start is a dead proc, never a silent one
            logger.exception("starting the step of %s failed", req.proc_id)
            handle.fail(f"its step could not start: {type(exc).__name__}: {exc}")

    def _start_step(self, handle: StepHandle, req: LaunchRequest) -> None:
        try:
            node = self._node_for(req)
        except SlurmError as exc:
            handle.fail(str(exc))
            return
        if node is None:
            handle.fail(f"no node of Slurm job {self.alloc.job_id} is usable for {req.proc_id} "
                        f"(lost: {', '.join(sorted(self.lost)) or 'none'}); `sinfo -N` says why")
            return
        command = [self.python, "-m", "rlmesh.worker", "--controller", req.controller_addr, "--proc-id",
                   req.proc_id, "--proc-mesh", req.proc_mesh, "--rank", str(req.rank), "--incarnation",
                   str(req.incarnation)]
        argv = srun_argv(self.config, self.alloc.job_id, node.name, handle.step_name, command,
                         self.gpus.get(req.proc_mesh, 0))
        try:
            handle.start(argv, self._env(req, node), node.name)
        except OSError as exc:
            handle.fail(f"srun could not start: {exc}")

    def _env(self, req: LaunchRequest, node: NodeInfo) -> dict[str, str]:
        """The step's environment: the controller's (as local procs get it, ``sys.path`` included),
        without its own ``SLURM_*`` step variables, plus the request's, the worker's network
        settings (bind all interfaces, advertise the node's address) and the SIGTERM plugin."""
        env = starters.worker_env({**self.config.env, **req.env})
        env = {k: v for k, v in env.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}
        plugins = [p for p in env.get(settings.WORKER_PLUGINS.name, "").split(",") if p.strip()]
        env[settings.WORKER_PLUGINS.name] = ",".join([*plugins, PLUGIN])
        env[settings.BIND_HOST.name] = self.config.bind_host
        env[settings.ADVERTISE_HOST.name] = node.addr
        return env

    def _node_for(self, req: LaunchRequest) -> NodeInfo | None:
        """Where this incarnation goes: its rank's node on a first start; on a restart that node if it
        is still usable, else the usable node with the fewest of this run's live steps."""
        layout = self.layouts.get(req.proc_mesh) or []
        want = layout[req.rank] if req.rank < len(layout) else None
        if req.incarnation == 0 and want in self.nodes:
            return self.nodes[want]
        nodes = self.refresh_nodes()
        usable = [n for n in nodes if n.usable and self._answers(n)]
        for n in usable:
            if n.name == want:
                return n
        if not usable:
            return None
        with self._lock:
            load = {n.name: 0 for n in usable}
            for h in list(self.handles.values()):  # poll() may end a step, which removes it from the dict
                if h.node in load and h.poll() is None:
                    load[h.node] += 1
        best = min(usable, key=lambda n: (load[n.name], nodes.index(n)))
        if want is not None:
            logger.warning("%s restarts on Slurm node %s: its node %s is lost or not usable", req.proc_id,
                           best.name, want)
        return best

    def _answers(self, node: NodeInfo) -> bool:
        ok = self.alloc.answers(node)
        if not ok and node.name not in self.lost:
            self.lost.add(node.name)
            logger.warning("Slurm node %s (%s) does not answer: a lost host; its procs restart elsewhere",
                           node.name, node.addr)
        elif ok:
            self.lost.discard(node.name)
        return ok

    # ------------------------------------------------------------------ StepOwner (pool and reader threads)
    def submit(self, fn: Callable[..., Any], *args: Any) -> None:
        """Run ``fn(*args)`` on the launcher's pool; exceptions are logged (callers do not wait)."""
        def call() -> None:
            try:
                fn(*args)
            except Exception:
                logger.exception("Slurm launcher task %s failed", getattr(fn, "__name__", fn))
        try:
            self._pool.submit(call)
        except RuntimeError:  # pool shut down at exit
            logger.debug("launcher closed; %s skipped", getattr(fn, "__name__", fn))

    def cancel_step(self, handle: StepHandle) -> None:
        """``scancel --signal=KILL`` the step (found by its name): SIGKILL to its task, wherever it runs."""
        self._cancel_all([handle.step_name])

    def _cancel_all(self, names: list[str]) -> None:
        try:
            listing = run(["squeue", "--steps", f"--jobs={self.alloc.job_id}", "--noheader", "--format=%i %j"],
                          timeout=10)
        except SlurmError as exc:
            logger.debug("listing the steps of job %s: %s", self.alloc.job_id, exc)
            return
        wanted = set(names)
        ids = [line.split()[0] for line in listing.splitlines() if len(line.split()) == 2 and line.split()[1] in wanted]
        if ids:
            try:
                run(["scancel", "--signal=KILL", *ids], timeout=10)
            except SlurmError as exc:
                logger.debug("scancel %s: %s", ids, exc)

    def on_sigterm(self, handle: StepHandle) -> None:
        """A worker reported Slurm's SIGTERM: if the job is ending, stop the run (once); if only this
        step was signalled (``scancel`` of the step), it is this proc's death: end its step."""
        self.submit(self._judge_sigterm, handle)

    def _judge_sigterm(self, handle: StepHandle) -> None:
        try:
            info = self.alloc.job()
        except SlurmError as exc:
            logger.warning("Slurm signalled %s, and its job cannot be read (%s): stopping the run", handle.step_name, exc)
            info = None
        now = datetime.datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
        fate = JobState.GONE if info is None else info.fate(now)
        if fate == JobState.RUNNING:
            logger.warning("Slurm sent SIGTERM to step %s (%s) alone: it ends as a dead proc", handle.step_name,
                           handle.meta.proc_id)
            handle.kill()
            return
        with self._lock:
            first, self.job_ending = not self.job_ending, True
        if first:
            how = "gone" if info is None else "preempted" if fate == JobState.ENDING and info.preempt_time != "None" \
                else info.state.lower()
            why = f"Slurm job {self.alloc.job_id} is ending ({how})"
            logger.warning("%s: stopping the run in order (final checkpoint); `rlmesh run resume=...` continues it",
                           why)
            self.on_job_ending(why)

    def step_finished(self, handle: StepHandle) -> None:
        """A step ended: forget it, and wake the supervisor to collect the exit now."""
        with self._lock:
            self.handles.pop(handle.step_name, None)
        Controller.notice_exit_if_open()

    # ------------------------------------------------------------------ teardown
    def close(self) -> None:
        """Kill the run's steps still running and give back an allocation the launcher asked for."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            self._stop.set()
            live = [h for h in list(self.handles.values()) if h.popen is not None and h.popen.poll() is None]
        if live:
            self._cancel_all([h.step_name for h in live])
        for h in live:
            h.killed = True
            try:
                h.popen.wait(KILL_WAIT_S)  # type: ignore[union-attr]  # not None: filtered above
            except subprocess.TimeoutExpired:
                h.popen.kill()  # type: ignore[union-attr]
        self._pool.shutdown(wait=True, cancel_futures=True)
        self.alloc.release()


def _stop_this_process(why: str) -> None:
    """What a job that is ending does to the controller by default: SIGTERM to itself, which
    ``rlmesh run`` turns into its orderly stop (``interrupted``, resumable); elsewhere the
    program's own SIGTERM handling applies."""
    os.kill(os.getpid(), signal.SIGTERM)
