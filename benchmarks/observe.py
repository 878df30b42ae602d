"""Observability claims from issue 14, measured on this machine (part of ``benchmarks/telemetry.py``).

    .venv/bin/python benchmarks/observe.py [--quick] [--capture] [--stacks] [--snapshot] [--mcp]

1. log capture overhead: a proc printing ~10,000 lines/s (each line after ~100 µs of work),
   throughput with capture on (FIFOs read by the launcher, rows into ``logs``, terminal echo)
   vs off (inherited stdout), paired rounds, both writing where the terminal would be /dev/null;
2. time to dump the stacks of 8 live procs into ``stacks`` (signal, dump, rows queryable);
3. an incremental Parquet snapshot of the live read path (new rows, and nothing new), and how
   fresh each live read path is (snapshot vs ``rm.telemetry.query`` vs an Arrow Flight DoGet);
4. one MCP ``query`` round trip (SDK stdio client -> ``rlmesh mcp``) vs the same query through
   ``rlmesh sql --format json`` (a new process each time) and through ``rm.telemetry.query``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Iterator

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import rlmesh as rm  # noqa: E402
from _common import Report, add_common_args, banner  # noqa: E402

QUICK = "--quick" in sys.argv
PARTS = ("capture", "stacks", "snapshot", "live", "mcp")
ONLY = [p for p in PARTS if f"--{p}" in sys.argv] or list(PARTS)  # e.g. --capture: that part alone
WORK_PER_LINE_S = 100e-6


class Printer(rm.Actor):
    @rm.endpoint
    def spew(self, lines: int, spin: int) -> tuple[float, float]:
        """``lines`` lines, each after ``spin`` loop turns of work: (lines per second, CPU µs per line) achieved."""
        t, c = time.perf_counter(), time.thread_time()
        for i in range(lines):
            for _ in range(spin):
                pass
            print(f"step {i}: loss=0.1234 reward=0.5678 lr=3e-4 tokens=2048 policy_version=17")
        return lines / (time.perf_counter() - t), (time.thread_time() - c) / lines * 1e6

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


@dataclass
class CaptureCost:
    """Paired rounds of the same proc workload, capture off and on (medians and sorted per-round ratios)."""

    rate_off: float  # lines/s
    rate_on: float
    wall_ratios: list[float]  # per round: time per line on / off - 1 (what the proc lost, load included)
    cpu_ratios: list[float]  # per round: the proc's own CPU per line on / off - 1 (its write(2) per line)
    ctl_us_per_line: list[float]  # per round: controller CPU (all threads) per captured line, on minus off
    stored: int


def bench_capture(rounds: int, lines: int) -> CaptureCost:
    spin = _spin_for(WORK_PER_LINE_S)
    with _terminal_to_devnull():
        os.environ["RLMESH_CAPTURE"] = "0"
        off_procs = rm.this_host().spawn_procs(per_host={"procs": 1}, name="capture_off")
        os.environ.pop("RLMESH_CAPTURE")
        on_procs = rm.this_host().spawn_procs(per_host={"procs": 1}, name="capture_on")
        off, on = off_procs.spawn("p_off", Printer), on_procs.spawn("p_on", Printer)
        off.spew.call_one(1000, spin).get()
        on.spew.call_one(1000, spin).get()
        rates_on, rates_off, ratios, cpu_ratios, ctl = [], [], [], [], []
        for i in range(rounds):  # order alternates, so a load change mid-round hits both sides alike
            c0 = time.process_time()
            first, second = (off, on) if i % 2 == 0 else (on, off)
            a = first.spew.call_one(lines, spin).get()
            c1 = time.process_time()
            b = second.spew.call_one(lines, spin).get()
            c2 = time.process_time()
            (r_off, cpu_off), (r_on, cpu_on) = (a, b) if first is off else (b, a)
            ctl_on, ctl_off = (c2 - c1, c1 - c0) if first is off else (c1 - c0, c2 - c1)
            rates_off.append(r_off)
            rates_on.append(r_on)
            ratios.append(r_off / r_on - 1)  # extra time per line with capture
            cpu_ratios.append(cpu_on / cpu_off - 1)
            ctl.append((ctl_on - ctl_off) / lines * 1e6)
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
    return CaptureCost(statistics.median(rates_off), statistics.median(rates_on), sorted(ratios), sorted(cpu_ratios),
                       sorted(ctl), stored)


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


def bench_live_paths(repeats: int) -> tuple[list[float], list[float], list[float]]:
    """How fresh each live read path is, on this run: a marker row recorded, then read back.

    (1) Parquet snapshots: seconds until the row is in ``runs/<run>/live/<table>`` (pyarrow
    dataset, as pandas/polars read it): the snapshot interval's phase plus the snapshot cost;
    (2) ``rm.telemetry.query`` round trip; (3) an Arrow Flight ``DoGet`` round trip to a
    minimal Flight server in this process answering the same SQL through the service: what
    a Flight SQL endpoint would cost per query (no ADBC Flight SQL driver or server is
    installed here, so plain Flight stands in for it).
    """
    import pyarrow.dataset as ds
    import pyarrow.flight as fl

    from rlmesh.telemetry import api
    from rlmesh.telemetry.snapshots import LIVE_DIR, interval_from_env

    live = api.current_run_dir() / LIVE_DIR / "bench_marker"
    snap, direct, flight = [], [], []
    sql = "SELECT count(*) AS n FROM bench_marker"

    class Server(fl.FlightServerBase):
        def do_get(self, context, ticket):  # noqa: ANN001 - pyarrow's signature
            return fl.RecordBatchStream(rm.telemetry.query(ticket.ticket.decode()))

    server = Server("grpc://127.0.0.1:0")
    client = fl.connect(f"grpc://127.0.0.1:{server.port}")
    try:
        for i in range(repeats):
            time.sleep(random.uniform(0, interval_from_env()))  # a random phase against the snapshot clock
            rm.telemetry.record("bench_marker", i=i)
            t = time.perf_counter()
            rm.telemetry.flush()
            direct.append(time.perf_counter() - t)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    if ds.dataset(live, format="parquet").to_table().num_rows > i:
                        break
                except (FileNotFoundError, OSError, ValueError):
                    pass
                time.sleep(0.05)
            snap.append(time.perf_counter() - t)
            t = time.perf_counter()
            rm.telemetry.query(sql)
            direct[-1] += time.perf_counter() - t
            t = time.perf_counter()
            got = client.do_get(fl.Ticket(sql.encode())).read_all()
            flight.append(time.perf_counter() - t)
            assert got.column("n")[0].as_py() == i + 1
    finally:
        client.close()
        server.shutdown()
    return sorted(snap), sorted(direct), sorted(flight)


def _ms(xs: list[float]) -> str:
    return f"median {statistics.median(xs) * 1e3:.1f} ms (min {xs[0] * 1e3:.1f}, max {xs[-1] * 1e3:.1f})"


def main(quick: bool = QUICK, report: Report | None = None, smoke: bool = False) -> None:
    """Every part named in ``ONLY``; ``smoke``: each at its smallest size (a few seconds in all)."""
    report = report or Report("observe", smoke=smoke)
    rounds, lines = (2, 2_000) if smoke else (5, 20_000) if quick else (7, 50_000)
    if rm.telemetry.current_run() is None:  # run alone (not after benchmarks/telemetry.py): this is the run
        rm.telemetry.start_run(config={"benchmark": "observe"})
    if "capture" in ONLY:
        _capture(rounds, lines, report)
    if "stacks" in ONLY:
        procs = 2 if smoke else 8
        st = bench_stacks(procs, 1 if smoke else 3 if quick else 5)
        print(f"stacks of {procs} live procs into the stacks table:  {_ms(st)}")
        report.row(figure=f"stacks of {procs} procs s", seconds=st)
    if "snapshot" in ONLY:
        n = 100_000 if smoke else 1_000_000 if quick else 5_000_000
        full, idle = bench_snapshot(n)
        print(f"Parquet snapshot (live read path): {n / 1e6:.1f} M new rollouts rows {full * 1e3:.0f} ms "
              f"({n / full / 1e6:.1f} M rows/s); nothing new {idle * 1e3:.1f} ms")
        report.row(figure="snapshot", rows=n, full_s=full, idle_s=idle)
    if "live" in ONLY:
        snap, direct, flight = bench_live_paths(2 if smoke else 5 if quick else 10)
        print(f"a new row readable: Parquet snapshot (pandas/polars) after {_ms(snap)}\n"
              f"                    rm.telemetry.query (flush + query) {_ms(direct)}\n"
              f"                    Arrow Flight DoGet of the same query (stand-in for Flight SQL) {_ms(flight)}")
        report.row(figure="a new row readable s", snapshot=snap, query=direct, flight=flight)
    if "mcp" in ONLY:
        inproc, cli, mcp = bench_mcp(1 if smoke else 5 if quick else 15)
        print(f"one query round trip: MCP tool call {_ms(mcp)}\n"
              f"                      rlmesh sql --format json (new process) {_ms(cli)}\n"
              f"                      rm.telemetry.query in the controller {_ms(inproc)}")
        report.ratio("mcp_query_vs_sql_cli", [statistics.median(mcp) / statistics.median(cli)],
                     "MCP round trip / rlmesh sql process, medians (not interleaved)")
        report.row(figure="one query round trip s", mcp=mcp, cli=cli, inproc=inproc)


def _capture(rounds: int, lines: int, report: Report) -> None:
    cc = bench_capture(rounds, lines)
    report.ratio("log_capture_on_vs_off", [1 + r for r in cc.wall_ratios], "time per line with capture / without")
    report.target("log_capture_on_vs_off", statistics.median([1 + r for r in cc.wall_ratios]), 1.05)
    med = statistics.median
    print(f"log capture, proc printing ~{1 / WORK_PER_LINE_S:,.0f} lines/s, {rounds} paired rounds of {lines:,} lines "
          f"(load {os.getloadavg()[0]:.1f}):\n"
          f"  throughput off {cc.rate_off:9,.0f} lines/s, on {cc.rate_on:9,.0f} lines/s; cost "
          f"{med(cc.wall_ratios) * 100:+.1f} % median (range {cc.wall_ratios[0] * 100:+.1f}..{cc.wall_ratios[-1] * 100:+.1f} %; "
          f"target <= +5 %)\n"
          f"  the proc's own CPU per line, on vs off: {med(cc.cpu_ratios) * 100:+.1f} % median "
          f"(range {cc.cpu_ratios[0] * 100:+.1f}..{cc.cpu_ratios[-1] * 100:+.1f} %): the cost where a core is spare\n"
          f"  controller CPU per captured line (read, logs row, echo): {med(cc.ctl_us_per_line):.1f} µs median "
          f"(range {cc.ctl_us_per_line[0]:.1f}..{cc.ctl_us_per_line[-1]:.1f}); {cc.stored:,} lines in logs")


if __name__ == "__main__":
    os.environ.setdefault("RLMESH_RUNS_DIR", __import__("tempfile").mkdtemp(prefix="rlmesh-bench-runs-"))
    os.environ.setdefault("RLMESH_HEARTBEAT_TIMEOUT_S", "10")  # a loaded VM must not cut a measurement short
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    for part in PARTS:
        ap.add_argument(f"--{part}", action="store_true", help=f"the {part} part (none named: all)")
    add_common_args(ap)
    cli_args = ap.parse_args()
    banner("rlmesh observability: log capture, stacks, snapshots, live reads, MCP", "duckdb", "pyarrow", "mcp")
    main(cli_args.quick, rep := Report("observe", smoke=cli_args.smoke, args=vars(cli_args)), smoke=cli_args.smoke)
    print(f"# load at the end {os.getloadavg()[0]:.1f}")
    rep.write(cli_args.json)
