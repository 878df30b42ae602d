"""Helpers shared by benchmark scripts: the machine/load/version banner, timing statistics, interleaved
rounds with per-round ratios, target lines, the ``--smoke``/``--json`` options and the JSON report.

Every script prints its figures as lines a reader (and ``tests/integration/benchmarks``) can find:

    ratio <name>: median 1.23x p90 1.40x over 5 rounds (<subject> / <floor>)
    target <name>: 1.23x (target <= 2x): met
    baseline <name>: not run: <why> (<how to get it>)

and, with ``--json PATH``, writes the same figures with the machine, the load and the versions, so
``benchmarks/run_all.py`` can build the table in docs/performance.md from one run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from importlib import metadata
from typing import Any, Callable


def versions(*packages: str) -> str:
    out = []
    for p in packages:
        try:
            out.append(f"{p} {metadata.version(p)}")
        except metadata.PackageNotFoundError:
            out.append(f"{p} (not installed)")
    return ", ".join(out)


def load() -> float:
    """The 1-minute load average (``-1`` where the platform has none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return -1.0


def machine() -> str:
    cpu = platform.processor() or "?"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    return f"{platform.machine()} {os.cpu_count()} cores ({cpu}), {platform.platform()}, python {platform.python_version()}"


def banner(title: str, *packages: str) -> None:
    print(f"# {title}")
    print(f"# machine: {machine()}")
    print(f"# versions: {versions('rlmesh', 'pyzmq', *packages)}")
    print(f"# load at start: {load():.2f} (1-minute average)")
    print(f"# date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}", flush=True)


def timed(fn: Callable[[], Any], n: int, warmup: int = 50) -> list[float]:
    """Per-call wall times in seconds (after ``warmup`` untimed calls)."""
    for _ in range(warmup):
        fn()
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def median(xs: list[float]) -> float:
    return statistics.median(xs)


def p90(xs: list[float]) -> float:
    """The 90th percentile, nearest rank (of 2 values, the larger; of 10, the 9th)."""
    return sorted(xs)[max(0, math.ceil(0.9 * len(xs)) - 1)]


def raw_kill() -> float:
    """SIGKILL of a plain idle child process to its parent's ``wait`` returning: the crash floor."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    time.sleep(0.2)  # started and idle, as the proc is
    t0 = time.monotonic()
    p.kill()
    p.wait()
    return time.monotonic() - t0


def run_json(args: list[str], timeout: float = 600, env: dict[str, str] | None = None) -> dict | None:
    """Run ``python <args>`` and parse the last stdout line as JSON (``None`` if it failed)."""
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-2000:])
        return None
    return json.loads(lines[-1])


def interleave(rounds: int, floor: Callable[[], float], subject: Callable[[], float]) -> tuple[list[float], list[float]]:
    """``rounds`` of (floor, subject), the order alternating round by round, so a change of load or
    of the scheduler's placement hits both sides alike. Each callable returns its round's figure."""
    fs, ss = [], []
    for i in range(rounds):
        if i % 2 == 0:
            fs.append(floor())
            ss.append(subject())
        else:
            ss.append(subject())
            fs.append(floor())
    return fs, ss


@dataclass
class Ratio:
    """Per-round ratios of a subject to its floor, measured in the same rounds."""

    name: str
    rounds: list[float]
    unit: str = "subject / floor"

    @property
    def median(self) -> float:
        return statistics.median(self.rounds)

    @property
    def p90(self) -> float:
        return p90(self.rounds)


@dataclass
class Target:
    name: str
    measured: float
    target: float
    at_most: bool
    met: bool
    note: str = ""
    unit: str = "x"


@dataclass
class Report:
    """What one run of a script prints and writes: its table rows, ratios, targets and baselines not run."""

    title: str
    smoke: bool = False
    args: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, Any]] = field(default_factory=list)
    ratios: list[Ratio] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    not_run: dict[str, str] = field(default_factory=dict)
    load_start: float = field(default_factory=load)

    def row(self, **values: Any) -> None:
        """One row of the script's table (kept for the JSON; the script prints its own table)."""
        self.rows.append(values)

    def ratio(self, name: str, per_round: list[float], unit: str = "subject / floor") -> Ratio:
        """Record and print the per-round ratios of one figure: ``ratio <name>: median .. p90 ..``."""
        r = Ratio(name, [float(x) for x in per_round], unit)
        self.ratios.append(r)
        print(f"ratio {name}: median {r.median:.2f}x p90 {r.p90:.2f}x over {len(r.rounds)} rounds "
              f"(range {min(r.rounds):.2f}-{max(r.rounds):.2f}; {unit})", flush=True)
        return r

    def target(self, name: str, measured: float, target: float, at_most: bool = True, note: str = "",
               unit: str = "x") -> bool:
        """Record and print a target line: the measured ratio (or ``unit``) against the target, met or not."""
        met = measured <= target if at_most else measured >= target
        self.targets.append(Target(name, float(measured), float(target), at_most, met, note, unit))
        print(f"target {name}: {measured:.2f}{unit} (target {'<=' if at_most else '>='} {target:g}{unit}): "
              f"{'met' if met else 'NOT met'}{f' ({note})' if note else ''}", flush=True)
        return met

    def skipped(self, name: str, why: str) -> None:
        """A baseline this run could not measure, said as such (never a silent gap)."""
        self.not_run[name] = why
        print(f"baseline {name}: not run: {why}", flush=True)

    def write(self, path: str | None, extra: dict[str, Any] | None = None) -> None:
        """Write the report as JSON to ``path`` (nothing without ``--json``), with a script's ``extra`` keys."""
        if not path:
            return
        data = {
            **(extra or {}),
            "title": self.title, "smoke": self.smoke, "args": self.args,
            "machine": machine(), "versions": versions("rlmesh", "pyzmq", "torch", "duckdb"),
            "load_start": self.load_start, "load_end": load(), "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
            "rows": self.rows,
            "ratios": [{**asdict(r), "median": r.median, "p90": r.p90} for r in self.ratios],
            "targets": [asdict(t) for t in self.targets],
            "not_run": self.not_run,
        }
        with open(path, "w") as f:
            json.dump(data, f, indent=1, default=str)
        print(f"# wrote {path}", flush=True)


def add_common_args(ap: argparse.ArgumentParser, json_default: str | None = None) -> None:
    """``--smoke`` (tiny sizes, a few seconds: what the test suite runs) and ``--json PATH``."""
    ap.add_argument("--smoke", action="store_true", help="tiny sizes, a few seconds: checks that the script runs")
    ap.add_argument("--json", default=json_default, metavar="PATH", help="also write the results as JSON here")


def have(module: str) -> bool:
    """Whether an optional baseline's package is importable (without importing it)."""
    return importlib.util.find_spec(module) is not None
