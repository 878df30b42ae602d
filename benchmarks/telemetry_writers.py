"""Telemetry rows/s the service sustains with N writers (issue 16, item 5).

    python benchmarks/telemetry_writers.py [--sizes 8,64,256] [--hosts 4] [--seconds 6]

A controller process starts a run (its in-process service, DuckDB file and all). ``--hosts``
writer processes each play N/hosts procs: one real ``Recorder`` + ``RemoteSink`` per simulated
proc (its own flush thread and authenticated PUSH socket, as in a worker), each recording
1,000-row batches of a 6-column table as fast as it can for ``--seconds``, then closing as a proc
does at exit. Per N it prints the rows offered, the rows that landed in the file, rows/s landed
(from the first batch to the last row in the file) and what writers dropped (their backlog is
bounded). Baseline in the same run: one process appending the same batches straight into DuckDB
(the floor, no network, no service).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time

os.environ.setdefault("RLMESH_RUNS_DIR", tempfile.mkdtemp(prefix="rlmesh-bench-writers-"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import duckdb  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402

import rlmesh as rm  # noqa: E402
from _common import Report, add_common_args, banner  # noqa: E402

BATCH = 1000
TABLE = "bench_writers"


def batch(writer: int, seq: int) -> pa.Table:
    rng = np.random.default_rng(writer * 1_000_003 + seq)
    return pa.table({"writer": np.full(BATCH, writer, np.int32), "seq": np.full(BATCH, seq, np.int64),
                     "i": np.arange(BATCH, dtype=np.int64), "reward": rng.random(BATCH),
                     "length": rng.integers(1, 500, BATCH), "env": ["cartpole"] * BATCH})


def writer_host(first: int, count: int, seconds: float, env: dict[str, str], out: mp.Queue) -> None:
    """One host: ``count`` simulated procs, each a Recorder + RemoteSink of its own."""
    os.environ.update(env)
    from rlmesh.telemetry.client import RemoteSink
    from rlmesh.telemetry.recorder import Recorder
    from rlmesh.transport import Authenticator

    auth = Authenticator.from_env()
    recs = [Recorder(env["RLMESH_RUN_ID"], RemoteSink(env["RLMESH_TELEMETRY_ADDR"], auth, f"w{first + k}",
                                                      env.get("RLMESH_TELEMETRY_QUERY_ADDR")))
            for k in range(count)]
    tables = [batch(first + k, 0) for k in range(count)]
    offered = [0] * count
    stop = time.monotonic() + seconds

    def play(k: int) -> None:
        while time.monotonic() < stop:
            recs[k].record_batch(TABLE, tables[k])
            offered[k] += BATCH
            time.sleep(0.01)  # a proc that does work between batches: 100 batches/s at most

    threads = [threading.Thread(target=play, args=(k,)) for k in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    dropped = 0
    for r in recs:  # as a proc at exit: a last flush, then up to 2 s to ship the backlog
        r.close()
        r._sink.close()
        dropped += r._sink.dropped_rows
    out.put((sum(offered), dropped))


def count_rows() -> int:
    try:
        return int(rm.telemetry.query(f"SELECT count(*) AS n FROM {TABLE}").to_pylist()[0]["n"])
    except Exception:  # noqa: BLE001 - the table does not exist before the first batch lands
        return 0


def measure(n: int, hosts: int, seconds: float, settle_s: float = 3.0) -> dict:
    before = count_rows()
    env = {k: v for k, v in rm.telemetry.api.worker_env().items()}
    env["RLMESH_SECRET"] = os.environ["RLMESH_SECRET"]
    ctx = mp.get_context("spawn")
    out: mp.Queue = ctx.Queue()
    per = [n // hosts + (1 if h < n % hosts else 0) for h in range(hosts)]
    firsts = [sum(per[:h]) for h in range(hosts)]
    procs = [ctx.Process(target=writer_host, args=(firsts[h], per[h], seconds, env, out)) for h in range(hosts) if per[h]]
    t0 = time.monotonic()
    for p in procs:
        p.start()
    results = [out.get(timeout=seconds + 300) for _ in procs]
    for p in procs:
        p.join(60)
    offered, dropped = sum(r[0] for r in results), sum(r[1] for r in results)
    landed, last_change, last = before, time.monotonic(), -1
    while time.monotonic() - last_change < settle_s:  # until the count has not moved for settle_s
        landed = count_rows()
        if landed != last:
            last, last_change = landed, time.monotonic()
        time.sleep(0.2)
    landed -= before
    return {"n": n, "offered": offered, "landed": landed, "dropped": dropped,
            "rows_per_s": landed / (last_change - t0)}


def floor(seconds: float) -> float:
    """DuckDB's own append rate for the same batches into a file, in this process (no service, no network)."""
    path = os.path.join(tempfile.mkdtemp(prefix="rlmesh-bench-floor-"), "floor.duckdb")
    con = duckdb.connect(path)
    t = batch(0, 0)  # noqa: F841 - read by name in the SQL below (DuckDB replacement scan)
    con.execute(f"CREATE TABLE {TABLE} AS SELECT * FROM t LIMIT 0")
    rows, t0 = 0, time.monotonic()
    while time.monotonic() - t0 < seconds:
        con.execute(f"INSERT INTO {TABLE} SELECT * FROM t")
        rows += BATCH
    rate = rows / (time.monotonic() - t0)  # each INSERT committed to the WAL, as the service's are
    con.close()
    os.unlink(path)
    return rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="8,64,256")
    ap.add_argument("--hosts", type=int, default=4)
    ap.add_argument("--seconds", type=float, default=6.0)
    ap.add_argument("--rounds", type=int, default=2, help="floor and writers alternated, per size")
    add_common_args(ap)
    args = ap.parse_args()
    settle = 3.0
    if args.smoke:
        args.sizes, args.hosts, args.seconds, args.rounds, settle = "2", 1, 0.5, 2, 0.3
    banner("telemetry rows/s with N writers", "duckdb", "pyarrow")
    report = Report("telemetry_writers", smoke=args.smoke, args=vars(args))
    rm.telemetry.start_run()
    print("| N writers | rows offered | rows landed | rows/s landed | floor rows/s | / floor | dropped by writers |")
    print("|---|---|---|---|---|---|---|")
    for n in (int(x) for x in args.sizes.split(",")):
        ratios = []
        for i in range(args.rounds):
            if i % 2 == 0:
                base = floor(args.seconds / 2)
                r = measure(n, min(args.hosts, n), args.seconds, settle)
            else:
                r = measure(n, min(args.hosts, n), args.seconds, settle)
                base = floor(args.seconds / 2)
            ratios.append(r["rows_per_s"] / base)
            print(f"| {n} | {r['offered']:,} | {r['landed']:,} | {r['rows_per_s']:,.0f} | {base:,.0f} | "
                  f"{r['rows_per_s'] / base:.2f} | {r['dropped']:,} |", flush=True)
            report.row(**r, floor_rows_per_s=base)
        report.ratio(f"writers_{n}_vs_duckdb", ratios, "rows/s landed / DuckDB's own append rows/s")
    print(f"# load average at end: {os.getloadavg()[0]:.1f}")
    rm.telemetry.end_run()
    report.write(args.json)


if __name__ == "__main__":
    main()
