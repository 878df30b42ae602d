"""Admission: refuse, before any proc starts, a plan that needs far more procs than this host holds.

Why: ``rlmesh run generator.replicas=500`` used to be accepted and fork until the host ran out
(33 procs and 8.4 GB in 1.3 s, about 256 MB a proc once each had imported torch and built its
actors), taking the host, and everyone else's work on it, down with it. A number that large is a
typo or a plan for a cluster; either way the right answer is one line, before the first fork.

The rule: a host holds ``min(memory, descriptors)`` procs of one controller, where

- memory = ``MemAvailable`` now (``/proc/meminfo``: what can be allocated without swapping) divided
  by :data:`PROC_BYTES`, the memory a recipe proc was measured to take;
- descriptors = the controller's free file descriptors (``RLIMIT_NOFILE`` less those open) divided
  by :data:`CONTROLLER_FDS_PER_PROC`, what each proc costs the controller (sockets, output pipes).

CPU is not a limit: more procs than cores is slower, not fatal. ``RLMESH_MAX_PROCS`` replaces the
rule with a number (a host whose procs are smaller, or bigger, than the measure).

On a cluster (:func:`admit_cluster`) the same question is asked of every node a mesh may use,
summed (:class:`ClusterCapacity`): Kubernetes' nodes' ``allocatable`` from the API server (schedulable,
Ready, matching the mesh's node selector), Slurm's nodes of the job from ``scontrol``. A mesh, beside
the procs its cluster already runs, is refused when its procs ask for more memory than the nodes
have (a pod's memory request, else the 256 MiB a recipe proc takes), more CPU than they have (a
pod's CPU request: the scheduler never places what no node can take; Slurm's CPU-only steps share
CPUs, so there CPU is not a limit), or more pods than the nodes take. Why: such a mesh never starts;
its pods stay ``Pending`` (or its steps wait) until the start timeout, two minutes later, with no
word on why. ``RLMESH_MAX_PROCS`` replaces this rule too.

Two places ask: a recipe, for all its meshes together (:func:`admit`, before its run folder exists),
and every ``this_host().spawn_procs(...)``, for the procs it asks for (:func:`admit_spawn`, before
the first fork). A program that calls ``spawn_procs`` in a loop is refused at the call that would
not fit: the memory and descriptors read then already count the procs started before it, and
``RLMESH_MAX_PROCS`` counts them explicitly.
"""

from __future__ import annotations

import math
import os
import resource
from dataclasses import dataclass

from rlmesh import settings
from rlmesh.errors import ConfigError

MiB = 1 << 20
PROC_BYTES = 256 * MiB
"""Memory a recipe proc takes once its actors are built (torch imported, a policy, its envs):
8.4 GB over 33 procs of ``generator.replicas=500`` on the 2-core test host."""
CONTROLLER_FDS_PER_PROC = 16
"""File descriptors each proc costs its controller: 9.5 measured over 6 procs, with room."""


@dataclass(frozen=True)
class ClusterCapacity:
    """What the nodes a mesh may use offer in all, as their scheduler counts it."""

    cpus: float
    """CPU cores."""
    memory: int
    """Bytes."""
    slots: int | None
    """Procs the nodes take in all (Kubernetes' ``pods`` allocatable); None: no such limit."""
    where: str
    """Those nodes, in words (``the 3 schedulable Ready nodes of the cluster``), for the refusal."""


@dataclass(frozen=True)
class ProcDemand:
    """What one proc of a mesh takes on a cluster, and the settings that say so."""

    memory: int = PROC_BYTES
    """Bytes: the pod's memory request, else :data:`PROC_BYTES`."""
    cpus: float = 0.0
    """CPU cores the scheduler reserves for it (0: none: CPU is shared, not refused)."""
    memory_key: str = ""
    """The setting of ``memory`` (``launcher.meshes.pods.memory``); empty: the measured size."""
    cpu_key: str = ""
    """The setting of ``cpus``."""


def cluster_refusal(new: int, demand: ProcDemand, running: list[ProcDemand], cap: ClusterCapacity,
                    max_procs: int = 0) -> str | None:
    """Why ``new`` procs of ``demand``, beside ``running`` ones, do not fit ``cap``; None when they fit
    (pure: :func:`admit_cluster` reads the settings). ``max_procs`` > 0 replaces the rule."""
    total = new + len(running)
    beside = f" (with the {len(running)} of this cluster running)" if running else ""
    if max_procs > 0:
        return None if total <= max_procs else f"{total} procs{beside}, beyond {settings.MAX_PROCS.name}={max_procs}"
    if cap.slots is not None and total > cap.slots:
        return f"{total} pods{beside}, more than the {cap.slots} pod slots of {cap.where}"
    memory = new * demand.memory + sum(d.memory for d in running)
    if memory > cap.memory:
        each = f"{_size(demand.memory)} a proc" + (f" ({demand.memory_key})" if demand.memory_key else
                                                   " (what a recipe proc takes)")
        return f"{_size(memory)} of memory for {total} procs{beside} at {each}, more than the {_size(cap.memory)} of {cap.where}"
    cpus = new * demand.cpus + sum(d.cpus for d in running)
    if demand.cpus > 0 and cpus > cap.cpus + 1e-9:
        return (f"{cpus:g} CPUs for {total} procs{beside} at {demand.cpus:g} a proc ({demand.cpu_key}), more than "
                f"the {cap.cpus:g} of {cap.where}")
    return None


def admit_cluster(what: str, new: int, demand: ProcDemand, running: list[ProcDemand], cap: ClusterCapacity,
                  fix: str) -> None:
    """Raise :class:`ConfigError` (one line) when ``new`` procs of ``demand`` do not fit the cluster ``cap``.

    ``what``: the call or setting that asks for them; ``fix``: what to lower (the setting to raise,
    ``RLMESH_MAX_PROCS``, is named after it)."""
    why = cluster_refusal(new, demand, running, cap, settings.MAX_PROCS.get())
    if why is not None:
        raise ConfigError(f"{what} needs {why}; {fix}, or set {settings.MAX_PROCS.name}={new + len(running)} "
                          f"to start them anyway")


def _size(n: float) -> str:
    return f"{n / (1 << 30):.1f} GiB" if n >= 1 << 30 else f"{n / MiB:.0f} MiB"


_QUANTITY_SUFFIX = {"m": 1e-3, "": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15, "E": 1e18,
                    "Ki": 2.0 ** 10, "Mi": 2.0 ** 20, "Gi": 2.0 ** 30, "Ti": 2.0 ** 40, "Pi": 2.0 ** 50, "Ei": 2.0 ** 60}


def quantity(text: str) -> float:
    """A Kubernetes quantity (``"500m"``, ``"16Gi"``, ``"129e6"``, ``"4"``) as a number."""
    text = str(text).strip()
    if "e" in text[1:] and text.replace("e", "", 1).replace(".", "", 1).isdigit():
        return float(text)
    for suffix in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei", "m", "k", "M", "G", "T", "P", "E"):
        if text.endswith(suffix):
            return float(text[:-len(suffix)]) * _QUANTITY_SUFFIX[suffix]
    return float(text)


@dataclass(frozen=True)
class HostCapacity:
    """How many procs this host can take now, and what limits it."""

    procs: int
    """The most procs to start on this host."""
    limited_by: str
    """Why that number: the memory, the descriptors, or ``RLMESH_MAX_PROCS``, in words."""

    def fits(self, needed: int) -> bool:
        return needed <= self.procs


def capacity(mem_available: int, fds_free: int, max_procs: int = 0) -> HostCapacity:
    """The rule of the module docstring, from its inputs (pure: ``host_capacity`` reads them)."""
    if max_procs > 0:
        return HostCapacity(max_procs, f"{settings.MAX_PROCS.name}={max_procs}")
    by_memory = mem_available // PROC_BYTES
    by_fds = fds_free // CONTROLLER_FDS_PER_PROC
    if by_memory <= by_fds:
        return HostCapacity(int(by_memory), f"{mem_available / (1 << 30):.1f} GiB available / "
                                            f"{PROC_BYTES // MiB} MiB a proc")
    return HostCapacity(int(by_fds), f"{fds_free} free file descriptors / {CONTROLLER_FDS_PER_PROC} a proc")


def mem_available() -> int:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes; where there is none (not Linux), a figure that
    never refuses (the check is a guard, not a requirement)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 1 << 50


def fds_free() -> int:
    """File descriptors this process may still open."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    if soft == resource.RLIM_INFINITY:
        soft = 1 << 20
    try:
        used = len(os.listdir("/proc/self/fd"))
    except OSError:
        used = 0
    return max(0, soft - used)


def host_capacity() -> HostCapacity:
    return capacity(mem_available(), fds_free(), settings.MAX_PROCS.get())


def admit(needed: int, what: str, fix: str) -> None:
    """Raise :class:`ConfigError` (one line) when ``needed`` procs do not fit this host now.

    ``what``: the setting that asks for them (``generator.replicas=500``); ``fix``: what to lower.
    """
    cap = host_capacity()
    if not cap.fits(needed):
        raise ConfigError(f"{what} needs {needed} procs on this host, which holds {cap.procs} now "
                          f"({cap.limited_by}); {fix}, or set {settings.MAX_PROCS.name}={needed} to start them anyway")


def admit_spawn(dims: dict[str, int], running: int) -> None:
    """Raise :class:`ConfigError` (one line) when ``spawn_procs(per_host=dims)`` does not fit this host now.

    ``running``: procs of this controller already alive on this host. They count against
    ``RLMESH_MAX_PROCS`` (the most procs of one controller); the rule of the module docstring reads
    memory and descriptors as they are now, which already leaves out what the running procs hold.
    """
    new = math.prod(dims.values())
    cap = host_capacity()
    counted = running if settings.MAX_PROCS.get() > 0 else 0
    if cap.fits(new + counted):
        return
    beside = f" beside the {counted} of this controller running" if counted else ""
    raise ConfigError(f"spawn_procs(per_host={dims}) needs {new} procs on this host{beside}, which holds "
                      f"{cap.procs} now ({cap.limited_by}); spawn fewer procs, or set "
                      f"{settings.MAX_PROCS.name}={new + counted} to start them anyway")
