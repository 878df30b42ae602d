"""``SlurmConfig``: where worker procs run as Slurm job steps (the ``launcher=slurm`` settings).

Plain dataclasses with a docstring per field, so Hydra registers them as the ``launcher`` group
and a bad value fails in ``__post_init__`` before any step starts. Messages name the key as
``launcher.<field>`` and say the fix. Types stay within what OmegaConf accepts.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any, Dict, List

from rlmesh.errors import ConfigError

_DISTRIBUTIONS = ("block", "cyclic")
_TIME = re.compile(r"^(\d+(-\d+)?(:\d+){0,2}|UNLIMITED|INFINITE)?$")
_NAME = re.compile(r"^[A-Za-z0-9][-A-Za-z0-9_.]*$")


def _check(ok: bool, key: str, value: object, fix: str) -> None:
    if not ok:
        raise ConfigError(f"launcher.{key}={value!r} is invalid: {fix}")


@dataclass
class SlurmConfig:
    """Settings of the Slurm launcher: one worker proc = one job step (``srun``) of one task."""

    nodes: int = 0
    """Nodes a mesh is spread over when the program gives no ``hosts=``: 0 = every node of the
    allocation. When the controller asks for an allocation itself, also how many it asks for
    (0 there = 1)."""
    distribution: str = "block"
    """How a mesh's ranks map to its nodes when the program gives no ``hosts=``: ``block`` (ranks
    0..k-1 on the first node, as ``srun -m block``) or ``cyclic`` (rank r on node r mod nodes)."""
    partition: str = ""
    """Partition of an allocation the controller asks for (``salloc -p``); empty = the default."""
    account: str = ""
    """Account charged for an allocation the controller asks for (``salloc -A``); empty = the default."""
    time: str = ""
    """Time limit of an allocation the controller asks for (``salloc -t``, ``HH:MM:SS`` or ``D-HH``)."""
    alloc_args: List[str] = field(default_factory=list)
    """Extra ``salloc`` arguments for an allocation the controller asks for (``--qos=...``)."""
    srun_args: List[str] = field(default_factory=list)
    """Extra ``srun`` arguments for every worker step (``--mem-per-cpu=4G``, ``--exclusive``)."""
    cpus_per_task: int = 0
    """``srun --cpus-per-task`` for every worker; 0 = Slurm's default."""
    gpus_per_task: int = -1
    """GPUs bound to each worker (``srun --gres=gpu:N``); -1 = 1 for a mesh with a ``gpus``
    dimension on nodes whose GRES lists GPUs, else none; 0 = none."""
    python: str = ""
    """Interpreter on the nodes; steps run ``<python> -m rlmesh.worker ...``. Empty = this one
    (a shared filesystem, as on most clusters)."""
    env: Dict[str, str] = field(default_factory=dict)
    """Extra environment variables for the workers (steps inherit the controller's otherwise)."""
    bind_host: str = "0.0.0.0"
    """``RLMESH_BIND_HOST`` of the workers; each advertises its node's address (``NodeAddr``)."""
    controller_host: str = ""
    """Address the workers dial the controller at; empty = this host's address on the route to
    the first node (set before the controller starts: ``RLMESH_ADVERTISE_HOST``)."""
    job_name: str = "rlmesh"
    """Name of an allocation the controller asks for, and the prefix of its steps' names."""
    start_timeout_s: float = 120.0
    """How long ``salloc`` may wait for the allocation it asked for before the spawn fails."""

    def __post_init__(self) -> None:
        self.alloc_args = [str(a) for a in self.alloc_args]
        self.srun_args = [str(a) for a in self.srun_args]
        self.env = {str(k): str(v) for k, v in dict(self.env).items()}
        _check(self.nodes >= 0, "nodes", self.nodes, "use 0 (every node of the allocation) or more")
        _check(self.distribution in _DISTRIBUTIONS, "distribution", self.distribution,
               f"use one of {', '.join(_DISTRIBUTIONS)}")
        _check(bool(_TIME.match(self.time)), "time", self.time, "use Slurm's form: MM, HH:MM:SS or D-HH:MM")
        _check(self.cpus_per_task >= 0, "cpus_per_task", self.cpus_per_task, "use 0 (Slurm's default) or more")
        _check(self.gpus_per_task >= -1, "gpus_per_task", self.gpus_per_task,
               "use -1 (one per rank of a 'gpus' dimension where nodes have GPUs), 0 (none) or more")
        _check(bool(_NAME.match(self.job_name)), "job_name", self.job_name,
               "use letters, digits, '-', '_' and '.'")
        _check(self.start_timeout_s > 0, "start_timeout_s", self.start_timeout_s, "use a number of seconds > 0")
        for k in self.env:
            _check(bool(re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", k)), "env", k,
                   "environment variable names are letters, digits and '_'")

    @classmethod
    def from_dict(cls, data: Mapping[str, Any] | None) -> "SlurmConfig":
        """Build from a mapping (a YAML preset, the Hydra ``launcher`` group, an OmegaConf
        ``DictConfig``); unknown keys fail, naming the valid ones."""
        plain = _plain(dict(data or {}))
        known = {f.name for f in fields(cls)}
        extra = sorted(set(plain) - known)
        if extra:
            raise ConfigError(f"launcher: unknown key(s) {extra} for launcher=slurm; valid keys are {sorted(known)}")
        return cls(**plain)


def _plain(v: Any) -> Any:
    """Mappings and sequences (OmegaConf's included) as plain dicts and lists, recursively."""
    if isinstance(v, Mapping):
        return {str(k): _plain(x) for k, x in v.items()}
    if isinstance(v, Sequence) and not isinstance(v, (str, bytes)):
        return [_plain(x) for x in v]
    return v
