"""The job the procs run in: the allocation the controller is inside, or one it asks Slurm for.

Inside ``sbatch`` or ``salloc`` (``SLURM_JOB_ID`` is set) the launcher uses that job and never ends
it. Anywhere else it runs ``salloc --no-shell`` for ``launcher.nodes`` nodes and cancels the job
when the launcher closes. Either way the node list is read from Slurm each time it is needed, not
from the environment: with ``--no-kill`` a failed node leaves the job, and Slurm's view is the one
that says where a replacement may go.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess

from rlmesh.errors import ConfigError
from rlmesh.launch.slurm.commands import JobInfo, NodeInfo, parse_granted, parse_job, parse_nodes, quote, salloc_argv
from rlmesh.launch.slurm.config import SlurmConfig

logger = logging.getLogger(__name__)

CALL_TIMEOUT_S = 30.0
"""A Slurm command that has not answered in this long fails (slurmctld down or unreachable)."""


class SlurmError(RuntimeError):
    """A Slurm command failed; the message has the command, its output and what to check."""


def slurm_env() -> dict[str, str]:
    """The environment for the launcher's own Slurm commands: the controller's, without the
    ``SLURM_*`` variables of the step or batch script it may run in (``SLURM_NTASKS``,
    ``SLURM_CPUS_PER_TASK``...), which ``srun`` would read as defaults for every worker's step.
    ``SLURM_CONF`` stays: it says which cluster."""
    return {k: v for k, v in os.environ.items() if not k.startswith("SLURM_") or k == "SLURM_CONF"}


def run(argv: list[str], timeout: float = CALL_TIMEOUT_S) -> str:
    """Run a Slurm command and return its stdout; a failure raises :class:`SlurmError` with its output."""
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=slurm_env(),
                             stdin=subprocess.DEVNULL)
    except FileNotFoundError:
        raise SlurmError(f"{argv[0]} not found: launcher=slurm needs Slurm's client commands (salloc, srun, "
                         f"scontrol, scancel) on PATH; on Debian: apt-get install slurm-client") from None
    except subprocess.TimeoutExpired:
        raise SlurmError(f"`{quote(argv)}` did not answer in {timeout:.0f} s: is slurmctld up and reachable "
                         f"(`scontrol ping`)?") from None
    if out.returncode != 0:
        raise SlurmError(f"`{quote(argv)}` failed (exit {out.returncode}): {(out.stderr or out.stdout).strip()}")
    return out.stdout


class Allocation:
    """A Slurm job whose nodes the launcher starts steps on."""

    def __init__(self, job_id: str, owned: bool):
        self.job_id = job_id
        self.owned = owned
        """The launcher asked for this job (``salloc``), so it cancels it on close."""
        self._port: int | None = None

    @classmethod
    def current(cls) -> "Allocation | None":
        """The job the controller runs in (``SLURM_JOB_ID``), or None outside any."""
        job = os.environ.get("SLURM_JOB_ID") or os.environ.get("SLURM_JOBID")
        return cls(job, owned=False) if job else None

    @classmethod
    def request(cls, config: SlurmConfig, nodes: int) -> "Allocation":
        """Ask Slurm for ``nodes`` nodes (``salloc --no-shell``) and wait until they are granted."""
        argv = salloc_argv(config, nodes)
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=config.start_timeout_s + 30,
                                 env=slurm_env(), stdin=subprocess.DEVNULL)
        except FileNotFoundError:
            raise SlurmError("salloc not found: launcher=slurm needs Slurm's client commands on PATH "
                             "(on Debian: apt-get install slurm-client)") from None
        except subprocess.TimeoutExpired:
            raise SlurmError(f"`{quote(argv)}` was not granted in {config.start_timeout_s:.0f} s; raise "
                             f"launcher.start_timeout_s or ask for fewer nodes (launcher.nodes)") from None
        job = parse_granted(out.stderr + out.stdout)
        if out.returncode != 0 or job is None:
            raise SlurmError(f"`{quote(argv)}` got no allocation (exit {out.returncode}): "
                             f"{(out.stderr or out.stdout).strip()}")
        logger.info("Slurm granted job %s (%d node(s)) for this controller", job, nodes)
        return cls(job, owned=True)

    def job(self) -> JobInfo | None:
        """The job as Slurm sees it now (None: Slurm no longer knows it)."""
        try:
            text = run(["scontrol", "-o", "show", "job", self.job_id])
        except SlurmError as exc:
            if "Invalid job id" in str(exc):
                return None
            raise
        return parse_job(text)

    def nodes(self) -> list[NodeInfo]:
        """The job's nodes now, in Slurm's order, with their addresses and states."""
        info = self.job()
        if info is None or not info.nodes or info.nodes == "(null)":
            raise SlurmError(f"Slurm job {self.job_id} has no nodes (state {info.state if info else 'gone'}); "
                             f"is it still running (`squeue -j {self.job_id}`)?")
        names = run(["scontrol", "show", "hostnames", info.nodes]).split()
        by_name = {n.name: n for n in parse_nodes(run(["scontrol", "-o", "show", "node", ",".join(names)]))}
        return [by_name.get(name, NodeInfo(name, name, "UNKNOWN")) for name in names]

    def slurmd_port(self) -> int:
        """The port every slurmd listens on (``SlurmdPort``), for :meth:`answers`."""
        if self._port is None:
            self._port = 6818
            for line in run(["scontrol", "show", "config"]).splitlines():
                key, _, value = line.partition("=")
                if key.strip() == "SlurmdPort" and value.strip().isdigit():
                    self._port = int(value.strip())
        return self._port

    def answers(self, node: NodeInfo, timeout: float = 1.0) -> bool:
        """Whether the node's slurmd accepts a connection now. Why: slurmctld marks a node that
        stopped answering only after ``SlurmdTimeout`` (minutes on most clusters); a replacement
        sent there meanwhile would wait on a dead node. A refused or silent port is a lost host."""
        try:
            with socket.create_connection((node.addr, self.slurmd_port()), timeout=timeout):
                return True
        except OSError:
            return False

    def release(self) -> None:
        """Cancel the job if the launcher asked for it (a job the controller runs in is left alone)."""
        if not self.owned:
            return
        self.owned = False
        try:
            run(["scancel", self.job_id], timeout=10)
        except SlurmError as exc:
            logger.warning("cancelling Slurm job %s failed (%s); run `scancel %s`", self.job_id, exc, self.job_id)


def route_address(peer: str, port: int = 9) -> str:
    """This host's address on the route to ``peer`` (a UDP socket's source address: nothing is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((socket.gethostbyname(peer), port))
        except OSError as exc:
            raise ConfigError(f"no route from this host to Slurm node {peer!r} ({exc}); set "
                              f"launcher.controller_host to an address the nodes can reach") from None
        return s.getsockname()[0]


def slurmctld_address() -> str:
    """The address of the cluster's (first) slurmctld: ``SlurmctldHost[0] = name(addr)`` in
    ``scontrol show config``, the address in brackets when there is one."""
    for line in run(["scontrol", "show", "config"]).splitlines():
        key, _, value = line.partition("=")
        if key.strip().startswith("SlurmctldHost"):
            value = value.strip()
            return value.split("(", 1)[1].rstrip(")") if "(" in value else value
    raise SlurmError("`scontrol show config` names no SlurmctldHost; set launcher.controller_host")
