"""Every ``RLMESH_*`` environment variable rlmesh reads: its type, its one default, what it does.

Why environment variables at all: workers are other processes, started by a launcher, and inherit
the controller's environment, so a variable set once reaches every proc of a job (local children
and, through ``launcher.forward_env``, Kubernetes pods). Recipes set most of these from their typed
configs (``TelemetryConfig.apply``); a library user sets them by hand.

How a module reads one: through the :class:`Setting` declared here, never ``os.environ``
(``tests/unit/test_settings.py`` fails otherwise)::

    from rlmesh import settings
    every = settings.HEALTH_INTERVAL.get()      # a float, the default when unset or empty
    env = {settings.SECRET.name: secret_hex}    # "RLMESH_SECRET", for a child's environment

A value is read when :meth:`Setting.get` is called, not when this module is imported, so a
variable set at run time (by a test, the launcher, ``TelemetryConfig.apply``) takes effect; the
few read once per process say so in their docs. An empty value counts as unset.

A value of the wrong form is reported the same way everywhere, naming the variable, the value
and the valid form: ``RLMESH_HEALTH_INTERVAL='fast': use a number of seconds >= 0``. Most
raise :class:`SettingError` (a ``ValueError``) where they are read; those read by background
samplers and output helpers, where a crash would lose a run for a cosmetic knob, log that line
once as a warning and use the default (marked "warns" in ``docs/environment.md``).

*Internal* variables are the controller-to-worker wiring (the job secret, the telemetry
addresses...): the runtime sets them for the procs it starts, and nobody else should.

``docs/environment.md`` is generated from this module: ``python -m rlmesh.settings --markdown``.
This module sits at the bottom of the import layers and imports only the standard library.
"""

from __future__ import annotations

import argparse
import logging
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

logger = logging.getLogger(__name__)

PREFIX = "RLMESH_"
T = TypeVar("T")

AREAS = {
    "transport": "Sockets, encryption, RDMA",
    "actor": "Actors, supervision, heartbeats, debugging",
    "launch": "Launching procs, their output",
    "telemetry": "Telemetry",
    "weights": "Weights and workspace sync",
    "rl": "Recipes and progress",
    "dashboard": "Dashboard",
}
"""The sections of ``docs/environment.md``, in order; every setting names one as its ``area``."""


class SettingError(ValueError):
    """An ``RLMESH_*`` variable holds a value of the wrong form; the message names it and the fix."""


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One ``RLMESH_<key>`` variable. Read it with :meth:`get` (at call time), name it with :attr:`name`."""

    key: str
    """The name without the prefix: ``HEALTH_INTERVAL`` for ``RLMESH_HEALTH_INTERVAL``."""
    default: T
    """What :meth:`get` returns when the variable is unset or empty."""
    doc: str
    """What the variable does, for ``docs/environment.md``."""
    area: str
    """Which section of the docs it belongs to (a key of :data:`AREAS`)."""
    form: str = "any text"
    """The valid values, as the error message and the docs say them."""
    parse: Callable[[str], T] = field(default=str, repr=False)  # type: ignore[assignment]
    """Turns the raw text into the value; raises ``ValueError`` for a value of the wrong form."""
    internal: bool = False
    """Set by the runtime for the procs it starts (wiring), not by users."""
    warns: bool = False
    """A bad value logs a warning and gives the default, instead of raising :class:`SettingError`."""
    default_doc: str | None = None
    """The default as the docs state it, where ``default`` alone does not say it (e.g. None)."""

    def __post_init__(self) -> None:
        if self.area not in AREAS:
            raise ValueError(f"{self.name}: area {self.area!r} is not one of {list(AREAS)}")
        if self.key in REGISTRY:
            raise ValueError(f"{self.name} is declared twice in rlmesh.settings")
        REGISTRY[self.key] = self

    @property
    def name(self) -> str:
        """The environment variable: ``RLMESH_<key>``."""
        return PREFIX + self.key

    def raw(self) -> str | None:
        """The variable's text as set now, or ``None`` when unset or empty."""
        value = os.environ.get(self.name)
        return value if value is not None and value.strip() else None

    def is_set(self) -> bool:
        """True when the variable holds a non-empty value."""
        return self.raw() is not None

    def get(self) -> T:
        """The value now: parsed, or the default when unset or empty (see the module docstring for a bad value)."""
        return self._parse(self.raw())

    def pop(self) -> T:
        """:meth:`get`, and remove the variable from this process's environment (its children do not inherit it)."""
        raw = os.environ.pop(self.name, None)
        return self._parse(raw if raw is not None and raw.strip() else None)

    def set(self, value: Any) -> str:
        """Set the variable in this process's environment (children inherit it); returns the text set."""
        text = str(value)
        os.environ[self.name] = text
        return text

    def setdefault(self, value: Any) -> str:
        """The variable's text if it is set, else set it to ``value``; returns the text now set."""
        raw = self.raw()
        return raw if raw is not None else self.set(value)

    def check(self, raw: str) -> T:
        """Parse ``raw`` as this variable's value, raising :class:`SettingError` if it is of the wrong form."""
        try:
            return self.parse(raw)
        except ValueError:
            raise SettingError(self.bad_value(raw)) from None

    def bad_value(self, raw: str) -> str:
        """The one message for a bad value: the variable, the value and the valid form."""
        return f"{self.name}={raw!r}: use {self.form}"

    def _parse(self, raw: str | None) -> T:
        if raw is None:
            return self.default
        if not self.warns:
            return self.check(raw)
        try:
            return self.parse(raw)
        except ValueError:
            message = f"{self.bad_value(raw)}; using the default, {self.default_text()}"
            if message not in _warned:
                _warned.add(message)
                logger.warning("%s", message)
            return self.default

    def default_text(self) -> str:
        """The default as the docs show it."""
        if self.default_doc is not None:
            return self.default_doc
        if isinstance(self.default, bool):
            return "1" if self.default else "0"
        if self.default is None or self.default == "":
            return "unset"
        if isinstance(self.default, float):
            return f"{self.default:g}"
        return str(self.default)


REGISTRY: dict[str, Setting[Any]] = {}
"""Every setting by key, in the order declared."""
_warned: set[str] = set()


def get(key: str) -> Any:
    """The value of ``RLMESH_<key>`` now (``get("HEALTH_INTERVAL")``); :meth:`Setting.get` of that setting."""
    return setting(key).get()


def setting(key: str) -> Setting[Any]:
    """The setting ``key`` (with or without the ``RLMESH_`` prefix); a ``KeyError`` names the close ones."""
    k = key.removeprefix(PREFIX)
    try:
        return REGISTRY[k]
    except KeyError:
        near = [PREFIX + n for n in REGISTRY if k.split("_")[0] in n]
        raise KeyError(f"{PREFIX}{k} is not an rlmesh setting" + (f"; did you mean {', '.join(near)}?" if near
                                                                  else "; see docs/environment.md")) from None


# ====================================================================== value forms
def _number(kind: type = float, lo: float | None = None, lo_open: bool = False,
            hi: float | None = None) -> Callable[[str], Any]:
    """A parser for a number within ``[lo, hi]`` (``(lo, hi]`` with ``lo_open``)."""
    def parse(raw: str) -> Any:
        value = kind(raw.strip())
        if math.isnan(value) or (lo is not None and (value <= lo if lo_open else value < lo)) or (
                hi is not None and value > hi):
            raise ValueError(raw)
        return value
    return parse


def _number_form(what: str, lo: float | None = None, lo_open: bool = False, hi: float | None = None) -> str:
    if lo is not None and hi is not None:
        return f"{what} {'>' if lo_open else '>='} {lo:g} and <= {hi:g}"
    if lo is not None:
        return f"{what} {'>' if lo_open else '>='} {lo:g}"
    return what


TRUE = ("1", "true", "yes", "on")
FALSE = ("0", "false", "no", "off")


def _flag(raw: str) -> bool:
    value = raw.strip().lower()
    if value in TRUE:
        return True
    if value in FALSE:
        return False
    raise ValueError(raw)


FLAG_FORM = "1 or 0 (also true/false, yes/no, on/off)"


def _choice(*choices: str, aliases: dict[str, str] | None = None) -> Callable[[str], str]:
    """A parser for one of ``choices`` (case and surrounding blanks ignored); ``aliases`` map to a choice."""
    def parse(raw: str) -> str:
        value = raw.strip().lower()
        value = (aliases or {}).get(value, value)
        if value not in choices:
            raise ValueError(raw)
        return value
    return parse


def _one_of(*choices: str) -> str:
    quoted = [repr(c) for c in choices]
    return " or ".join(quoted) if len(quoted) == 2 else f"one of {', '.join(quoted)}"


def _seconds(key: str, default: float | None, doc: str, area: str, lo: float = 0.0, lo_open: bool = False,
             hi: float | None = None, **kw: Any) -> Setting[Any]:
    """A duration in seconds."""
    return Setting(key, default, doc, area, form=_number_form("a number of seconds", lo, lo_open, hi),
                   parse=_number(float, lo, lo_open, hi), **kw)


# ====================================================================== transport
SECRET: Setting[str] = Setting(
    "SECRET", "", "The job's secret key (hex): every channel's messages are authenticated with keys "
    "derived from it, and CurveZMQ keys too. The controller makes one when it is unset and hands it to "
    "every proc through the environment (never argv); Kubernetes pods get it from the run's Secret.",
    "transport", form="hex digits", internal=True)
BIND_HOST: Setting[str] = Setting(
    "BIND_HOST", "127.0.0.1", "The address every socket binds to. Set `0.0.0.0` (with `RLMESH_ADVERTISE_HOST`) "
    "for peers on other hosts to reach this process; off loopback every connection is CurveZMQ-encrypted. "
    "Kubernetes pods get the launcher's `bind_host`.", "transport", form="a host name or IP address")
ADVERTISE_HOST: Setting[str] = Setting(
    "ADVERTISE_HOST", "", "The address peers dial when a socket binds a wildcard (`0.0.0.0`): "
    "a pod's IP, a Service, a VM's address in the cluster's network.", "transport",
    form="a host name or IP address", default_doc="this host's address")
LOCAL_TRANSPORT: Setting[str | None] = Setting(
    "LOCAL_TRANSPORT", None, "How channels that only this host dials (the actor data plane of local procs) "
    "carry messages: `ipc` (Linux abstract Unix sockets, ~20 µs less per call round trip) or `tcp` "
    "(loopback). A bind host, a fixed port or `RLMESH_TRANSPORT_ENCRYPTION=always` keep them on TCP anyway.",
    "transport", form="'ipc' (Unix sockets, Linux) or 'tcp' (loopback)", parse=_choice("ipc", "tcp"),
    default_doc="ipc on Linux, else tcp")
MAX_MESSAGE_MB: Setting[float] = Setting(
    "MAX_MESSAGE_MB", 256.0, "The largest frame a call channel takes, in MB: a larger one is refused before "
    "it is sent, and a peer that sends one is disconnected before it is buffered. Large tensors go through "
    "`rlmesh.weights`. Read once per process: set it for the whole job before the first `spawn_procs`.",
    "transport", form="a number of MB > 0", parse=_number(float, 0, lo_open=True))
TRANSPORT_ENCRYPTION: Setting[str] = Setting(
    "TRANSPORT_ENCRYPTION", "auto", "`auto`: CurveZMQ encryption on sockets off loopback only; `always`: "
    "on loopback too (a shared host whose other users may read loopback traffic).", "transport",
    form="'auto' (encrypt off loopback) or 'always'", parse=_choice("auto", "always"))
RDMA_DEVICE: Setting[str] = Setting(
    "RDMA_DEVICE", "", "The RDMA device weight and workspace transfers open (`mlx5_0`...).", "transport",
    form="an RDMA device name", default_doc="the first device")
RDMA_PORT: Setting[int] = Setting(
    "RDMA_PORT", 1, "The port of that RDMA device.", "transport", form="a whole number >= 1",
    parse=_number(int, 1))
RDMA_GID_INDEX: Setting[int] = Setting(
    "RDMA_GID_INDEX", 0, "The GID index on that port (RoCE v2 usually wants the index of an IPv4-mapped GID).",
    "transport", form="a whole number >= 0", parse=_number(int, 0))

# ====================================================================== actor
JOB_ID: Setting[str] = Setting(
    "JOB_ID", "", "The id shared by the controller and every worker of one job (names shared-memory "
    "segments and Kubernetes objects). The controller makes one when it is unset; a child `rlmesh run` "
    "inherits it.", "actor", form="a short id", internal=True)
CONTROLLER_PORT: Setting[int | None] = Setting(
    "CONTROLLER_PORT", None, "A fixed port for the controller's socket (behind a Kubernetes Service, "
    "a firewall).", "actor", form="a port number 1-65535", parse=_number(int, 1, hi=65535),
    default_doc="any free port")
HEARTBEAT_S: Setting[float] = Setting(
    "HEARTBEAT_S", 0.2, "Pins a worker's heartbeat interval. Unset, the supervisor sets it (0.2 s up to "
    "200 procs, then longer, at most 1 s at 1,000 procs).", "actor",
    form="a number of seconds > 0", parse=_number(float, 0, lo_open=True), default_doc="0.2 (then the supervisor's)")
CONTROLLER_TIMEOUT_S: Setting[float] = _seconds(
    "CONTROLLER_TIMEOUT_S", 10.0, "A worker whose controller has been silent this long exits (pods, "
    "and where a worker cannot watch its parent pid).", "actor", lo_open=True)
EVENT_LOOP: Setting[str | None] = Setting(
    "EVENT_LOOP", None, "The workers' asyncio event loop. uvloop costs 8-13 µs less CPU per call round "
    "trip; a loop named here that is not installed fails the proc's start with the fix.", "actor",
    form="'asyncio' or 'uvloop'", parse=_choice("asyncio", "uvloop"), default_doc="uvloop where installed")
START_TIMEOUT_S: Setting[float] = _seconds(
    "START_TIMEOUT_S", 120.0, "A proc must join (interpreter up, imports done, connected) within this, "
    "for meshes whose `Restart` carries no `detection=`. A recipe uses `run.start_timeout_s` (same "
    "default). Slow image pulls on Kubernetes want more.", "actor", lo_open=True)
HEARTBEAT_TIMEOUT_S: Setting[float] = _seconds(
    "HEARTBEAT_TIMEOUT_S", 1.5, "The least heartbeat silence that makes a proc dead (a quiet host's "
    "detection time for a hang); on a busy host the allowance grows with the delays observed. "
    "A recipe uses `run.heartbeat_timeout_s`.", "actor", lo_open=True)
INIT_HEARTBEAT_TIMEOUT_S: Setting[float] = _seconds(
    "INIT_HEARTBEAT_TIMEOUT_S", 30.0, "The same floor while an actor's `__init__` runs (first imports "
    "hold the GIL for seconds); never below `RLMESH_HEARTBEAT_TIMEOUT_S`. A recipe uses "
    "`run.init_heartbeat_timeout_s`.", "actor", lo_open=True)
SPAWN_TIMEOUT_S: Setting[float | None] = _seconds(
    "SPAWN_TIMEOUT_S", None, "How long one actor's `__init__` may take while its proc lives (a long "
    "construction is not a hang; a dead or silent proc is caught by the heartbeat anyway). A recipe "
    "uses `run.spawn_timeout_s`.", "actor", lo_open=True, default_doc="no limit")
HEARTBEAT_PHI: Setting[float] = Setting(
    "HEARTBEAT_PHI", 8.0, "Suspicion threshold of the heartbeat monitor: a silence as unlikely as "
    "10**-phi under the heartbeat delays observed so far makes a proc dead.", "actor",
    form="a number > 0", parse=_number(float, 0, lo_open=True))
HB_BOARD_OFF: Setting[bool] = Setting(
    "HB_BOARD_OFF", False, "`1`: procs on the controller's host beat by message instead of storing "
    "their heartbeats on the shared-memory board.", "actor", form=FLAG_FORM, parse=_flag, warns=True)
SHM_DIR: Setting[str] = Setting(
    "SHM_DIR", "/dev/shm", "Where the heartbeat board and shared-memory weight slots are made.",
    "actor", form="a directory on a tmpfs")
POST_MORTEM: Setting[bool] = Setting(
    "POST_MORTEM", False, "`1`: an endpoint that raises pauses in pdb at the exception until `rlmesh debug` "
    "attaches (set it for all procs, or one mesh's with `spawn_procs(env=...)`).", "actor",
    form=FLAG_FORM, parse=_flag, warns=True)
WORKER_PLUGINS: Setting[str] = Setting(
    "WORKER_PLUGINS", "", "Functions every worker calls at start with its `WorkerInfo`, comma-separated "
    "`module:function`; controller plugins add theirs (telemetry does).", "actor",
    form="comma-separated module:function")
LOG_LEVEL: Setting[str] = Setting(
    "LOG_LEVEL", "WARNING", "The lowest level of logging records that workers (and `rlmesh run`) store "
    "and show.", "actor", form=_one_of("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"),
    parse=lambda raw: _choice("debug", "info", "warning", "error", "critical")(raw).upper())
HB_BOARD: Setting[str] = Setting(
    "HB_BOARD", "", "The heartbeat-board slot (`path:slot`) a local proc stores its beats in.", "actor",
    form="path:slot", internal=True)
DEBUG_DIR: Setting[str] = Setting(
    "DEBUG_DIR", "", "Where a local proc writes the record of an actor paused in the debugger (the run's "
    "`debug/` folder), for `rlmesh debug`.", "actor", form="a directory", internal=True)
CAPTURE_DIR: Setting[str] = Setting(
    "CAPTURE_DIR", "", "The private folder of FIFOs a local proc writes its output, logging records and "
    "stacks into; removed from the worker's environment once read.", "actor", form="a directory",
    internal=True)
CAPTURE_STDIO: Setting[bool] = Setting(
    "CAPTURE_STDIO", False, "`1`: the proc opens its stdout/stderr FIFOs itself (a proc forked from a "
    "warm template).", "actor", form=FLAG_FORM, parse=_flag, internal=True)

# ====================================================================== launch
FORKSERVER: Setting[bool] = Setting(
    "FORKSERVER", True, "`0`: local procs start as fresh Python processes instead of being forked from "
    "a warm template (same as `this_host(fork_server=False)`).", "launch", form=FLAG_FORM, parse=_flag,
    warns=True)
MAX_PROCS: Setting[int] = Setting(
    "MAX_PROCS", 0, "The most procs one controller starts on this host with the local launcher, or on a "
    "Kubernetes or Slurm cluster in all; a recipe, or a `spawn_procs(...)`, that needs more is refused before "
    "its first proc starts. `0`: as many as this host's available memory (256 MiB a proc) and the "
    "controller's free file descriptors hold; on a cluster, as many as its nodes' memory, CPUs and pod "
    "slots hold (`rlmesh/launch/admission.py`).",
    "launch", form="a whole number >= 0", parse=_number(int, 0))
CAPTURE: Setting[bool] = Setting(
    "CAPTURE", True, "`0`: procs inherit the controller's stdout/stderr; no `logs`/`stacks` rows from "
    "workers, no stack dumps of hung procs.", "launch", form=FLAG_FORM, parse=_flag, warns=True)
ECHO: Setting[bool] = Setting(
    "ECHO", True, "`0`: workers' output is not echoed on the controller's terminal (the rows are still "
    "stored).", "launch", form=FLAG_FORM, parse=_flag, warns=True)
LOG_FOLD_S: Setting[float] = _seconds(
    "LOG_FOLD_S", 0.3, "The window in which a line printed by several ranks is folded into one; `0` "
    "prints each line.", "launch", warns=True)
CONTROLLER_POD: Setting[str] = Setting(
    "CONTROLLER_POD", "", "The pod the controller itself runs in (downward API): that pod then owns the "
    "run's Kubernetes objects, and deleting it removes them. `launcher.controller_pod` overrides it.",
    "launch", form="a pod name")
FRESH_IMPORTS: Setting[str] = Setting(
    "FRESH_IMPORTS", "", "Folders whose modules a proc forked from a warm template imports afresh (a "
    "synced workspace).", "launch", form="folders separated by os.pathsep", internal=True)
POD_NAME: Setting[str] = Setting(
    "POD_NAME", "", "A worker pod's own name (downward API).", "launch", form="a pod name", internal=True)

# ====================================================================== telemetry
TELEMETRY: Setting[bool] = Setting(
    "TELEMETRY", True, "`0`: record nothing; `record()` does nothing and no run is started.", "telemetry",
    form=FLAG_FORM, parse=_flag, warns=True)
RUNS_DIR: Setting[str] = Setting(
    "RUNS_DIR", "runs", "Where runs are written and looked up, relative to the working directory.",
    "telemetry", form="a directory")
TELEMETRY_FLUSH_S: Setting[float] = _seconds(
    "TELEMETRY_FLUSH_S", 0.2, "How often each proc ships its buffered rows; at most 0.9, to keep the "
    "promise that a row is in the file within a second.", "telemetry", lo_open=True, hi=0.9, warns=True)
HEALTH_INTERVAL: Setting[float] = _seconds(
    "HEALTH_INTERVAL", 1.0, "Seconds between `host_health`/`gpu_health` samples (one sampler per host); "
    "`0` turns all health sampling off, `proc_health` too.", "telemetry", warns=True)
PROC_HEALTH_INTERVAL: Setting[float] = _seconds(
    "PROC_HEALTH_INTERVAL", 5.0, "Seconds between each proc's `proc_health` sample of itself (RSS, CPU, "
    "threads, open files); `0` = off.", "telemetry", warns=True)
RSS_GROWTH_WINDOW_S: Setting[float] = _seconds(
    "RSS_GROWTH_WINDOW_S", 300.0, "The history the RSS growth warning looks at.", "telemetry", warns=True)
RSS_GROWTH_MIN_MB: Setting[float] = Setting(
    "RSS_GROWTH_MIN_MB", 512.0, "... the rise of RSS over that window must be at least this many MiB ...",
    "telemetry", form="a number of MiB >= 0", parse=_number(float, 0), warns=True)
RSS_GROWTH_RATIO: Setting[float] = Setting(
    "RSS_GROWTH_RATIO", 0.5, "... and at least this fraction of the RSS at the window's start.",
    "telemetry", form="a number >= 0", parse=_number(float, 0), warns=True)
SNAPSHOT_S: Setting[float] = _seconds(
    "SNAPSHOT_S", 5.0, "Seconds between Parquet snapshots of a live run's tables under "
    "`runs/<run>/live/` (for pandas, polars...); `0` = off.", "telemetry", warns=True)
SPANS: Setting[bool] = Setting(
    "SPANS", True, "`0`: workers record no `spans` rows (2-4 µs per call saved).", "telemetry",
    form=FLAG_FORM, parse=_flag, warns=True)
SPANS_MAX_PER_S: Setting[float] = Setting(
    "SPANS_MAX_PER_S", 1000.0, "Span rows per second per (actor, endpoint) in each proc; calls beyond it "
    "are counted in the next row's `weight` (errors are always recorded).", "telemetry",
    form="a number > 0", parse=_number(float, 0, lo_open=True), warns=True)
QUERY_TIMEOUT_S: Setting[float] = _seconds(
    "QUERY_TIMEOUT_S", 60.0, "The time limit of a telemetry query (`rlmesh sql`, `rm.telemetry.query`, the "
    "dashboard, MCP) when the call sets none (`timeout=`, `--timeout`): past it DuckDB stops the query.",
    "telemetry", lo_open=True)
TELEMETRY_CHECKPOINT_S: Setting[float] = _seconds(
    "TELEMETRY_CHECKPOINT_S", 10.0, "Seconds between the service's checkpoints of a live run's database "
    "(the write-ahead log folded into the main file): what a torn log can cost at most.", "telemetry",
    lo_open=True)
TELEMETRY_ADDR: Setting[str] = Setting(
    "TELEMETRY_ADDR", "", "Where a worker ships its telemetry rows (the run's ingest channel).",
    "telemetry", form="a channel address", internal=True)
TELEMETRY_QUERY_ADDR: Setting[str] = Setting(
    "TELEMETRY_QUERY_ADDR", "", "Where a worker's SQL queries of the live run go.", "telemetry",
    form="a channel address", internal=True)
RUN_ID: Setting[str] = Setting(
    "RUN_ID", "", "The run a worker records into.", "telemetry", form="a run id", internal=True)

# ====================================================================== weights, workspace
WEIGHTS_DIRECTORY: Setting[str] = Setting(
    "WEIGHTS_DIRECTORY", "", "A folder of JSON files as the directory of publishers, for every "
    "Publisher/Subscriber (a shared filesystem instead of the controller's key-value store).", "weights",
    form="a directory", default_doc="the controller's key-value store")
WEIGHTS_TCP_WINDOW_MIB: Setting[int] = Setting(
    "WEIGHTS_TCP_WINDOW_MIB", 64, "The most MiB a TCP weight reader asks for and has not received yet: what "
    "the connection may hold in the reader's memory besides its staging buffer of one version (chunks "
    "are cut smaller when the window holds fewer than four of 8 MiB).", "weights",
    form="a whole number >= 1", parse=_number(int, 1))
WORKSPACE_TRANSPORT: Setting[str] = Setting(
    "WORKSPACE_TRANSPORT", "auto", "How a host's workspace chunks reach it from its upstream: `auto` (RDMA "
    "READs where both ends have a device, else TCP), `tcp`, `rdma`, or `cma` (one machine only, for tests).",
    "weights", form=_one_of("auto", "tcp", "rdma", "cma"), parse=_choice("auto", "tcp", "rdma", "cma"))

# ====================================================================== rl, recipes
PROGRESS: Setting[str] = Setting(
    "PROGRESS", "auto", "How a run shows progress: `auto` (a bar on a terminal, plain lines when piped), "
    "`bar`, `plain`, `json` lines (for agents), or `off`.", "rl", form=_one_of("auto", "bar", "plain", "json", "off"),
    parse=_choice("auto", "bar", "plain", "json", "off", aliases={"0": "off", "false": "off", "no": "off"}),
    warns=True)
PROGRESS_EVERY_S: Setting[float] = _seconds(
    "PROGRESS_EVERY_S", 10.0, "Seconds between plain or JSON progress lines.", "rl", warns=True)
ALGORITHMS: Setting[str] = Setting(
    "ALGORITHMS", "", "Modules whose `register()` adds algorithms to `rlmesh run`, comma-separated "
    "(besides the `rlmesh.algorithms` entry points of installed packages).", "rl",
    form="comma-separated module names")
RECIPES_DIR: Setting[str] = Setting(
    "RECIPES_DIR", "", "The folder of recipe programs (`ppo.py`...) `rlmesh run` runs.", "rl",
    form="a directory", default_doc="the shipped recipes/")
HYDRA_JOB_DIR: Setting[str] = Setting(
    "HYDRA_JOB_DIR", "", "The sweep job's folder, which the run's folder is linked with.", "rl",
    form="a directory", internal=True)
SWEEP_STATUS_DIR: Setting[str] = Setting(
    "SWEEP_STATUS_DIR", "", "Where a sweep's jobs write their status records.", "rl", form="a directory",
    internal=True)

# ====================================================================== dashboard
DASHBOARD_TOKEN: Setting[str] = Setting(
    "DASHBOARD_TOKEN", "", "The dashboard's access token (16+ characters); `--token` overrides it.",
    "dashboard", form="a token of 16+ characters", default_doc="a random one")


# ====================================================================== docs/environment.md
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _default_cell(s: Setting[Any]) -> str:
    """The default as code (`120`), or as prose where it is described (any free port)."""
    text = _cell(s.default_text())
    return text if s.default_doc is not None or s.default in (None, "") else f"`{text}`"


def markdown() -> str:
    """``docs/environment.md``: every setting, public ones by area, then the internal ones."""
    public = [s for s in REGISTRY.values() if not s.internal]
    internal = [s for s in REGISTRY.values() if s.internal]
    intro = (f"rlmesh reads {len(REGISTRY)} `RLMESH_*` variables, {len(public)} of them for you to set and "
             f"{len(internal)} internal ones that the runtime sets for the procs it starts. Workers inherit the "
             "controller's environment (Kubernetes pods: through `launcher.forward_env`), so set a variable "
             "before the first `spawn_procs` and every proc of the job follows it; `spawn_procs(env=...)` sets "
             "one for a single mesh. A recipe sets the telemetry ones from its `telemetry.*` config.")
    reading = ("Each is read when it is needed, so a value set at run time takes effect, unless its text says "
               "it is read once. An empty value counts as unset. A value of the wrong form is named with the "
               "valid form (`RLMESH_HEALTH_INTERVAL='fast': use a number of seconds >= 0`): an error where it "
               "is read, or, for the variables marked *warns*, a warning and the default.")
    code = ("In code, read them through `rlmesh.settings` (`settings.HEALTH_INTERVAL.get()`), never "
            "`os.environ`; the variables of the development scripts are in [development.md](development.md).")
    out = ["# Environment variables", "",
           "<!-- Generated by `python -m rlmesh.settings --markdown > docs/environment.md` from",
           "     rlmesh/settings.py; edit that module, not this file (tests/unit/test_settings.py checks). -->",
           "", intro, "", reading, "", code, ""]
    for area, title in AREAS.items():
        rows = [s for s in public if s.area == area]
        if rows:
            out += [f"## {title}", "", "| variable | default | valid values | what it does |", "|---|---|---|---|"]
            out += [f"| `{s.name}` | {_default_cell(s)} | {_cell(s.form)}{' (warns)' if s.warns else ''} "
                    f"| {_cell(s.doc)} |" for s in rows]
            out.append("")
    wiring = ("The controller and launchers set these in the environment of each proc they start; "
              "setting them by hand breaks the wiring between controller and workers.")
    out += ["## Internal: set by the runtime for its procs", "", wiring, "",
            "| variable | what it carries |", "|---|---|"]
    out += [f"| `{s.name}` | {_cell(s.doc)} |" for s in internal]
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m rlmesh.settings", description="rlmesh's RLMESH_* settings")
    ap.add_argument("--markdown", action="store_true", help="print docs/environment.md")
    args = ap.parse_args(argv)
    if args.markdown:
        sys.stdout.write(markdown())
        return 0
    for s in REGISTRY.values():
        raw = s.raw()
        print(f"{s.name}={raw if raw is not None else ''}{'' if raw is not None else '  # ' + s.default_text()}"
              f"{'  (internal)' if s.internal else ''}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
