"""The Slurm commands the launcher runs, and what their output means: pure functions.

Why apart: the argv of ``salloc`` and ``srun`` and the parsing of ``scontrol -o`` lines are where
the mapping from meshes to nodes and tasks lives, and they are unit-tested without a cluster.
Everything here takes text and returns typed values; running the commands is :mod:`.allocation`'s
and :mod:`.steps`' job.
"""

from __future__ import annotations

import enum
import re
import shlex
import signal as _signal
from dataclasses import dataclass

from rlmesh.launch.slurm.config import SlurmConfig

PREEMPT_MARK = "rlmesh-slurm: SIGTERM from Slurm"
"""The line a worker step writes on its stderr when Slurm sends it SIGTERM (preemption, the time
limit, ``scancel``): the launcher reads it from ``srun``'s output and decides what it means."""

_BAD_STATES = ("DOWN", "DRAIN", "FAIL", "NOT_RESPONDING", "POWER", "REBOOT", "MAINT", "FUTURE", "UNKNOWN")


@dataclass(frozen=True)
class NodeInfo:
    """One node as ``scontrol -o show node`` describes it."""

    name: str
    addr: str
    state: str
    gres: str = ""
    cpus: int = 0
    """``CPUTot`` (0: not reported)."""
    memory_mb: int = 0
    """``RealMemory``, in MB as Slurm counts them (MiB; 0: not reported)."""

    @property
    def usable(self) -> bool:
        """False for a node Slurm knows is down, draining, failing or not responding (``DOWN*``,
        ``IDLE+NOT_RESPONDING``...): no new step goes there."""
        return not self.state.endswith("*") and not any(s in self.state for s in _BAD_STATES)

    @property
    def gpus(self) -> int:
        """GPUs in the node's GRES (``gpu:8``, ``gpu:a100:4(S:0-1)``), 0 when none."""
        total = 0
        for part in self.gres.split(","):
            bits = part.split("(")[0].split(":")
            if bits[0] == "gpu":
                total += int(bits[-1]) if bits[-1].isdigit() else 1
        return total


class JobState(enum.StrEnum):
    """What the launcher needs to know of its job: running on, or ending (the run should stop)."""

    RUNNING = "running"
    ENDING = "ending"  # preempted, cancelled, past its time limit: Slurm kills every step soon
    GONE = "gone"


@dataclass(frozen=True)
class JobInfo:
    job_id: str
    state: str
    nodes: str
    preempt_time: str = "None"
    end_time: str = "Unknown"

    def fate(self, now_iso: str) -> JobState:
        """Running, ending (a preemption was decided, or the end time has come) or gone."""
        if self.state in ("COMPLETED", "CANCELLED", "FAILED", "TIMEOUT", "PREEMPTED", "NODE_FAIL",
                          "BOOT_FAIL", "DEADLINE", "OUT_OF_MEMORY", "REVOKED"):
            return JobState.GONE
        if self.state in ("COMPLETING", "SUSPENDED", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED", "STOPPED"):
            return JobState.ENDING
        if self.preempt_time not in ("None", "", "Unknown"):
            return JobState.ENDING
        if self.end_time not in ("Unknown", "", "None") and self.end_time <= now_iso:
            return JobState.ENDING
        return JobState.RUNNING


def fields_of(line: str) -> dict[str, str]:
    """``Key=value`` pairs of one ``scontrol -o`` line; a word without ``=`` continues the value
    before it (``Reason=Not responding [root@...]``)."""
    out: dict[str, str] = {}
    key = ""
    for tok in line.split():
        k, sep, value = tok.partition("=")
        if sep and k and k[0].isalpha():
            key = k
            out[key] = value
        elif key:
            out[key] += " " + tok
    return out


def parse_nodes(text: str) -> list[NodeInfo]:
    """Every node of ``scontrol -o show node [NAMES]``."""
    nodes = []
    for line in text.splitlines():
        f = fields_of(line)
        if "NodeName" in f:
            gres = f.get("Gres", "")
            nodes.append(NodeInfo(f["NodeName"], f.get("NodeAddr") or f["NodeName"], f.get("State", ""),
                                  "" if gres == "(null)" else gres, _count(f.get("CPUTot")),
                                  _count(f.get("RealMemory"))))
    return nodes


def _count(value: str | None) -> int:
    return int(value) if value and value.isdigit() else 0


def parse_job(text: str) -> JobInfo | None:
    """The job of ``scontrol -o show job ID`` (None when Slurm no longer knows it)."""
    for line in text.splitlines():
        f = fields_of(line)
        if "JobId" in f:
            return JobInfo(f["JobId"], f.get("JobState", ""), f.get("NodeList", ""), f.get("PreemptTime", "None"),
                           f.get("EndTime", "Unknown"))
    return None


def parse_granted(text: str) -> str | None:
    """The job id of ``salloc: Granted job allocation 123`` (or ``... allocation 123 has been ...``)."""
    m = re.search(r"(?:Granted job allocation|Pending job allocation)\s+(\d+)", text)
    return m.group(1) if m and "Granted" in text else None


def salloc_argv(config: SlurmConfig, nodes: int) -> list[str]:
    """``salloc`` for an allocation of ``nodes`` nodes that lives until ``scancel``.

    ``--no-shell``: the allocation outlives the command, and steps join it with ``srun --jobid``.
    ``--no-kill``: a node that fails does not end the job: its procs are dead, the others go on, and
    their replacements start on the nodes left (Slurm's own words: the user takes on fault tolerance).
    """
    argv = ["salloc", "--no-shell", "--no-kill", f"--nodes={max(1, nodes)}", f"--job-name={config.job_name}",
            f"--immediate={int(config.start_timeout_s)}"]
    if config.partition:
        argv.append(f"--partition={config.partition}")
    if config.account:
        argv.append(f"--account={config.account}")
    if config.time:
        argv.append(f"--time={config.time}")
    return argv + list(config.alloc_args)


def srun_argv(config: SlurmConfig, job_id: str, node: str, step_name: str, command: list[str],
              gpus: int = 0) -> list[str]:
    """``srun`` for one worker: one task on ``node``, as a step of job ``job_id``.

    ``--overlap`` (CPU-only workers): steps share the allocation's CPUs with each other and with the
    controller's own step (without it a step waits for CPUs a long-lived worker holds). A worker
    bound to GPUs runs as an ``--exact`` step instead: overlapping steps share GRES too, so eight
    ``--gres=gpu:1`` steps with ``--overlap`` could all be handed the same GPU; the job must then
    hold the GPUs and CPUs (``sbatch --gpus-per-node=8 --ntasks-per-node=8``, or ``--exclusive``).
    ``--kill-on-bad-exit=0`` and one task per step: a proc's death ends only its own step, and the
    controller decides what to do. ``--input=none``: workers read no stdin.
    """
    argv = ["srun", f"--jobid={job_id}", "--exact" if gpus > 0 else "--overlap", "--nodes=1", "--ntasks=1",
            f"--nodelist={node}", f"--job-name={step_name}", "--kill-on-bad-exit=0", "--input=none", "--quiet"]
    if config.cpus_per_task:
        argv.append(f"--cpus-per-task={config.cpus_per_task}")
    if gpus > 0:
        argv.append(f"--gres=gpu:{gpus}")
    return argv + list(config.srun_args) + ["--", *command]


def gpus_per_task(config: SlurmConfig, dims: dict[str, int], nodes: list[NodeInfo]) -> int:
    """GPUs each worker of a mesh laid out as ``dims`` is bound to (see ``SlurmConfig.gpus_per_task``)."""
    if config.gpus_per_task >= 0:
        return config.gpus_per_task
    return 1 if "gpus" in dims and nodes and all(n.gpus > 0 for n in nodes) else 0


def place(n: int, nodes: int, distribution: str = "block", per_node: int = 0) -> list[int]:
    """The node index of each of ``n`` ranks over ``nodes`` nodes.

    ``per_node`` > 0 (the mesh has a ``hosts`` dimension): ranks ``k*per_node .. (k+1)*per_node-1``
    on node k, the tasks-per-node layout of ``srun --ntasks-per-node``. Else ``block`` gives each
    node a contiguous run of ranks (the first ``n % nodes`` nodes one more) and ``cyclic`` deals
    them out in turn.
    """
    if nodes < 1:
        raise ValueError("no node to place ranks on")
    if per_node:
        return [min(r // per_node, nodes - 1) for r in range(n)]
    if distribution == "cyclic":
        return [r % nodes for r in range(n)]
    base, extra = divmod(n, nodes)
    out: list[int] = []
    for k in range(nodes):
        out.extend([k] * (base + (1 if k < extra else 0)))
    return out


def step_outcome(returncode: int, lines: list[str]) -> tuple[int | None, int | None, str]:
    """``(exit_code, signal, reason)`` of a finished ``srun`` from its exit status and the last lines
    it printed: Slurm's words for a node failure, a cancel, a preemption or a time limit become the
    reason of the proc's death (the ``ActorDied`` error and the ``actors`` row)."""
    text = "\n".join(lines)
    reason = ""
    for pattern, why in ((r"[Nn]ode failure|NODE_FAIL|[Cc]ommunication connection failure", "node failure"),
                         (r"DUE TO PREEMPTION", "preempted by Slurm"),
                         (r"DUE TO TIME LIMIT", "the job's time limit"),
                         (r"CANCELLED", "cancelled (scancel)"),
                         (r"task \d+: Out Of Memory|oom-kill", "out of memory")):
        if re.search(pattern, text):
            reason = why
            break
    sig: int | None = None
    m = re.search(r"task \d+: (Killed|Terminated|Segmentation fault|Aborted)", text)
    if m:
        sig = {"Killed": _signal.SIGKILL, "Terminated": _signal.SIGTERM, "Segmentation fault": _signal.SIGSEGV,
               "Aborted": _signal.SIGABRT}[m.group(1)]
    elif returncode < 0:
        sig = -returncode
    elif returncode > 128 and returncode - 128 < _signal.NSIG:
        sig = returncode - 128
    code = None if sig is not None else returncode
    if not reason:
        last = [ln for ln in lines if ln.startswith(("srun:", "slurmstepd:"))]
        reason = f"srun: {last[-1].split(':', 1)[1].strip()}" if last and returncode else ""
    return code, int(sig) if sig is not None else None, reason


def quote(argv: list[str]) -> str:
    """A command as a shell would show it (for logs and errors)."""
    return " ".join(shlex.quote(a) for a in argv)
