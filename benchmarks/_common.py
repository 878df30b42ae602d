"""Helpers shared by benchmark scripts: machine/version banner, timing statistics, a subprocess runner."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
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


def banner(title: str, *packages: str) -> None:
    print(f"# {title}")
    print(f"# machine: {platform.machine()} {os.cpu_count()} cores, {platform.platform()}, "
          f"python {platform.python_version()}")
    print(f"# versions: {versions('rlmesh', 'pyzmq', *packages)}")
    print(f"# date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}")


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
    return sorted(xs)[int(0.9 * (len(xs) - 1))]


def run_json(args: list[str], timeout: float = 600) -> dict | None:
    """Run ``python <args>`` and parse the last stdout line as JSON (``None`` if it failed)."""
    proc = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        sys.stderr.write(proc.stderr[-2000:])
        return None
    return json.loads(lines[-1])
