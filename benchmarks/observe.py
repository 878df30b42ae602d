"""Observability claims from issue 14, measured on this machine (part of ``benchmarks/telemetry.py``).

    .venv/bin/python benchmarks/observe.py [--quick]     # this part alone

1. log capture overhead: a proc printing ~10,000 lines/s (each line after ~100 µs of work),
   throughput with capture on (FIFOs read by the launcher, rows into ``logs``, terminal echo)
   vs off (inherited stdout), paired rounds, both writing where the terminal would be /dev/null;
2. time to dump the stacks of 8 live procs into ``stacks`` (signal, dump, rows queryable);
3. an incremental Parquet snapshot of the live read path (new rows, and nothing new);
4. one MCP ``query`` round trip (SDK stdio client -> ``rlmesh mcp``) vs the same query through
   ``rlmesh sql --format json`` (a new process each time) and through ``rm.telemetry.query``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import time
from typing import Iterator

import rlmesh as rm

QUICK = "--quick" in sys.argv
WORK_PER_LINE_S = 100e-6


class Printer(rm.Actor):
    @rm.endpoint
    def spew(self, lines: int, spin: int) -> float:
        """``lines`` lines, each after ``spin`` loop turns of work; returns lines per second achieved."""
        t = time.perf_counter()
        for i in range(lines):
            for _ in range(spin):
                pass
            print(f"step {i}: loss=0.1234 reward=0.5678 lr=3e-4 tokens=2048 policy_version=17")
        return lines / (time.perf_counter() - t)

    @rm.endpoint
    def idle(self) -> None:
        return None


def _spin_for(seconds: float) -> int:
    n = 100_000
    t = time.perf_counter()
    for _ in range(n):
        pass
    return max(1, int(n * seconds / (time.perf_counter() - t)))


@contextlib.contextmanager
def _terminal_to_devnull() -> Iterator[None]:
    """fds 1 and 2 go to /dev/null (children spawned meanwhile inherit that), then come back."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.dup2(null, 2)
    try:
        yield
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os.dup2(saved[0], 1)
        os.dup2(saved[1], 2)
        for fd in (*saved, null):
            os.close(fd)


def bench_capture(rounds: int, lines: int) -> tuple[float, float, list[float], int]:
    spin = _spin_for(WORK_PER_LINE_S)
    with _terminal_to_devnull():
        os.environ["RLMESH_CAPTURE"] = "0"
        off_procs = rm.this_host().spawn_procs(per_host={"procs": 1}, name="capture_off")
        os.environ.pop("RLMESH_CAPTURE")
        on_procs = rm.this_host().spawn_procs(per_host={"procs": 1}, name="capture_on")
        off, on = off_procs.spawn("p_off", Printer), on_procs.spawn("p_on", Printer)
        off.spew.call_one(1000, spin).get()
        on.spew.call_one(1000, spin).get()
        rates_on, rates_off, ratios = [], [], []
        for _ in range(rounds):
            r_off = off.spew.call_one(lines, spin).get()
            r_on = on.spew.call_one(lines, spin).get()
            rates_off.append(r_off)
            rates_on.append(r_on)
            ratios.append(r_off / r_on - 1)  # extra time per line with capture
        off_procs.stop()
        on_procs.stop()
        deadline = time.monotonic() + 60
        want = (rounds * lines + 1000)
        while True:  # every line in the table (and echoed) before the terminal comes back
            stored = rm.telemetry.query("SELECT count(*) AS n FROM logs WHERE mesh = 'capture_on' "
                                        "AND message LIKE 'step %'").column("n")[0].as_py()
            if stored >= want or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        time.sleep(1.0)  # the echo holds lines for its fold window
    return statistics.median(rates_off), statistics.median(rates_on), sorted(ratios), stored


def bench_stacks(n_procs: int, repeats: int) -> list[float]:
    from rlmesh.telemetry import api, introspect

    run_dir = api.current_run_dir()
    with _terminal_to_devnull():
        procs = rm.this_host().spawn_procs(per_host={"procs": n_procs}, name="stacks8")
        procs.spawn("idle", Printer).idle.call().get()
    rm.telemetry.flush()  # the procs' spawned events are in the table before we look for live procs
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        got = introspect.take_stacks(run_dir, None, timeout=30)
        times.append(time.perf_counter() - t)
        ok = [p for p, d in got.items() if p.startswith("stacks8") and not d.startswith("not taken")]
        assert len(ok) == n_procs, got
    procs.stop()
    return sorted(times)


def bench_mcp(repeats: int) -> tuple[list[float], list[float], list[float]]:
    from mcp import ClientSession  # optional dependency: rlmesh[agents]
    from mcp.client.stdio import StdioServerParameters, stdio_client

    sql = "SELECT proc, count(*) AS n FROM logs GROUP BY proc ORDER BY n DESC"
    run = rm.telemetry.current_run()
    rm.telemetry.flush()
    inproc = []
    for _ in range(repeats):
        t = time.perf_counter()
        rm.telemetry.query(sql, run=run)
        inproc.append(time.perf_counter() - t)
    cli = []
    for _ in range(repeats):
        t = time.perf_counter()
        subprocess.run([sys.executable, "-m", "rlmesh.cli", "sql", run, sql, "--format", "json"], check=True,
                       capture_output=True)
        cli.append(time.perf_counter() - t)

    async def session() -> list[float]:
        params = StdioServerParameters(command=sys.executable, args=["-m", "rlmesh.cli", "mcp"], env=dict(os.environ))
        out = []
        async with stdio_client(params) as (r, w):
            async with ClientSession(r, w) as s:
                await s.initialize()
                for _ in range(repeats):
                    t = time.perf_counter()
                    res = await s.call_tool("query", {"sql": sql, "run": run})
                    out.append(time.perf_counter() - t)
                    assert not res.is_error, res.content
        return out

    return sorted(inproc), sorted(cli), sorted(asyncio.run(session()))


def bench_snapshot(rows: int) -> tuple[float, float]:
    """An incremental Parquet snapshot of ``rows`` new rollouts rows, and one with nothing new (seconds)."""
    import tempfile
    from pathlib import Path

    import duckdb

    from rlmesh.telemetry import schema
    from rlmesh.telemetry.snapshots import Snapshotter

    d = Path(tempfile.mkdtemp(prefix="rlmesh-bench-snap-"))
    con = duckdb.connect(str(d / "telemetry.duckdb"))
    con.execute(schema.builtin_ddl(schema.BUILTIN["rollouts"]))
    con.execute("INSERT INTO rollouts (run_id, ts, mesh, rank, proc, host, rollout_id, policy_version, reward, "
                "length, env) SELECT 'r', now(), 'gen', i % 8, 'gen.' || (i % 8), 'h', i::VARCHAR, i // 1000, "
                f"random(), 100, 'cartpole' FROM range({rows}) t(i)")
    snap = Snapshotter(con, d, 5.0)
    snap.root.mkdir()
    snap.snapshot()
    full = snap.last_s
    snap.snapshot()
    idle = snap.last_s
    con.close()
    import shutil

    shutil.rmtree(d, ignore_errors=True)
    return full, idle


def _ms(xs: list[float]) -> str:
    return f"median {statistics.median(xs) * 1e3:.1f} ms (min {xs[0] * 1e3:.1f}, max {xs[-1] * 1e3:.1f})"


def main(quick: bool = QUICK) -> None:
    rounds, lines = (3, 20_000) if quick else (7, 50_000)
    off, on, ratios, stored = bench_capture(rounds, lines)
    print(f"log capture, proc printing ~{1 / WORK_PER_LINE_S:,.0f} lines/s: off {off:9,.0f} lines/s, "
          f"on {on:9,.0f} lines/s; cost {statistics.median(ratios) * 100:+.1f} % median of {rounds} paired rounds "
          f"(range {ratios[0] * 100:+.1f}..{ratios[-1] * 100:+.1f} %; target <= +5 %); {stored:,} lines in logs")
    st = bench_stacks(8, 3 if quick else 5)
    print(f"stacks of 8 live procs into the stacks table:  {_ms(st)}")
    n = 1_000_000 if quick else 5_000_000
    full, idle = bench_snapshot(n)
    print(f"Parquet snapshot (live read path): {n / 1e6:.0f} M new rollouts rows {full * 1e3:.0f} ms "
          f"({n / full / 1e6:.1f} M rows/s); nothing new {idle * 1e3:.1f} ms")
    inproc, cli, mcp = bench_mcp(5 if quick else 15)
    print(f"one query round trip: MCP tool call {_ms(mcp)}\n"
          f"                      rlmesh sql --format json (new process) {_ms(cli)}\n"
          f"                      rm.telemetry.query in the controller {_ms(inproc)}")


if __name__ == "__main__":
    os.environ.setdefault("RLMESH_RUNS_DIR", __import__("tempfile").mkdtemp(prefix="rlmesh-bench-runs-"))
    os.environ.setdefault("RLMESH_HEARTBEAT_TIMEOUT_S", "10")  # a loaded VM must not cut a measurement short
    print(f"# rlmesh observability benchmark{' (--quick)' if QUICK else ''} | load {os.getloadavg()[0]:.1f}")
    main()
