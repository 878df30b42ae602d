"""Telemetry claims, measured in one run on this machine, each against its floor in the same rounds.

    .venv/bin/python benchmarks/telemetry.py [--rounds 5] [--json telemetry.json]   # --smoke: a few seconds

Prints, with the baseline measured in the same run, rounds interleaved (floor, subject; the order
alternating), the median and p90 of the per-round ratios:
  1. ingest: 4 actors ``record_batch`` their rows until the rows are in the file, against DuckDB's
     own Arrow-scan append (``INSERT INTO rollouts BY NAME``, what the service runs) of the same
     rows into a file of its own, in this process; and the same with one ``record()`` per row;
  2. the cost of one ``record()`` in the caller against a plain append of the same row to a list
     (a function call with the same keyword arguments: the least any record call can cost);
  3. a 1 ms endpoint called in a loop with and without span recording;
  4. a GROUP BY over ``rollouts``, live (through the service) and from the file.
Targets (issue 40): ingest >= 0.7x DuckDB's append; record() <= 2x a plain append; spans <= +5 %.
Without ``--smoke``, then benchmarks/observe.py: log capture overhead, stacks of 8 procs, MCP round trip.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

os.environ.setdefault("RLMESH_RUNS_DIR", tempfile.mkdtemp(prefix="rlmesh-bench-runs-"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import duckdb  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
from _common import Report, add_common_args, banner, interleave  # noqa: E402

import rlmesh as rm  # noqa: E402
from rlmesh.telemetry import schema  # noqa: E402
from rlmesh.telemetry.columnar import TS_TYPE  # noqa: E402

ENV_NAMES = ["cartpole", "pendulum", "gsm8k", "math"]
ACTORS = 4
# Workers exit after 10 s without a control message, and the controller sends none while
# calls go peer to peer; phases here can be longer than that.
KEEPALIVE = {"RLMESH_CONTROLLER_TIMEOUT_S": "600"}


def rollout_columns(n: int, seed: int = 0) -> dict[str, np.ndarray | list]:
    rng = np.random.default_rng(seed)
    return {
        "rollout_id": [f"r{i}" for i in range(n)],
        "policy_version": rng.integers(0, 100, n),
        "reward": rng.random(n),
        "length": rng.integers(1, 512, n),
        "env": [ENV_NAMES[i % 4] for i in range(n)],
        "duration_s": rng.random(n) / 100,
    }


def full_rollouts_table(n: int, seed: int = 0) -> pa.Table:
    """The rows as the service appends them: the automatic columns plus the producer's."""
    cols = rollout_columns(n, seed)
    auto = {"run_id": pa.array(["bench"] * n), "ts": pa.array(np.full(n, time.time_ns() // 1000), type=TS_TYPE),
            "mesh": pa.array(["gen"] * n), "rank": pa.array(np.zeros(n, dtype=np.int64)),
            "proc": pa.array(["gen.0"] * n), "host": pa.array(["h"] * n)}
    return pa.table({**auto, **cols})


class Floor:
    """DuckDB alone appending the same rows to a file of its own: the statement the service runs
    (``INSERT INTO rollouts BY NAME SELECT * FROM batch``), one per actor batch, prebuilt tables."""

    def __init__(self, per_actor: int, chunk: int) -> None:
        self.dir = tempfile.mkdtemp(prefix="rlmesh-bench-floor-")
        self.con = duckdb.connect(os.path.join(self.dir, "floor.duckdb"))
        self.con.execute(schema.builtin_ddl(schema.BUILTIN["rollouts"]))
        self.parts = [full_rollouts_table(chunk, seed=a) for a in range(ACTORS)] * max(1, per_actor // chunk)

    def round(self) -> float:
        t0 = time.perf_counter()
        for part in self.parts:
            self.con.register("part", part)
            self.con.execute("INSERT INTO rollouts BY NAME SELECT * FROM part")
            self.con.unregister("part")
        # no CHECKPOINT: each INSERT commits to the write-ahead log, as the service's do before its rows count
        return sum(p.num_rows for p in self.parts) / (time.perf_counter() - t0)


class Producer(rm.Actor):
    @rm.endpoint
    def rows(self, n: int) -> float:
        rec = rm.telemetry.record
        t0 = time.perf_counter()
        for i in range(n):
            rec("rollouts", rollout_id="r", policy_version=i % 100, reward=0.5, length=17, env="cartpole",
                duration_s=0.01)
        return time.perf_counter() - t0

    @rm.endpoint
    def batches(self, n: int, chunk: int) -> float:
        """Columns built once, outside the timing: the floor's tables are prebuilt too."""
        if getattr(self, "_chunk", None) is None or self._chunk.num_rows != chunk:
            self._chunk = pa.table(rollout_columns(chunk, seed=rm.context().rank))
        t0 = time.perf_counter()
        for _ in range(max(1, n // chunk)):
            rm.telemetry.record_batch("rollouts", self._chunk)
        return time.perf_counter() - t0

    @rm.endpoint
    def spans(self, on: bool) -> bool:
        """Toggle span recording in this proc, so on/off are measured on the same process."""
        from rlmesh.actor import hooks  # deferred: a worker-side internal, only this endpoint needs it

        if not hasattr(self, "_sink"):
            self._sink = hooks.span_sink()
        hooks.set_span_sink(self._sink if on else None)
        return self._sink is not None

    @rm.endpoint
    def busy(self, ms: float) -> int:
        end = time.perf_counter() + ms / 1000
        while time.perf_counter() < end:
            pass
        return 0


def count_rows() -> int:
    return int(rm.telemetry.query("SELECT count(*) AS n FROM rollouts").column("n")[0].as_py())


def wait_rows(target: int, timeout: float = 300) -> float:
    deadline = time.time() + timeout
    n = 0
    while time.time() < deadline:
        n = count_rows()
        if n >= target:
            return time.perf_counter()
        time.sleep(0.01)
    raise TimeoutError(f"only {n} of {target} rows arrived")


class Ingest:
    """rlmesh's side of a round: 4 actors hand over their rows; the clock stops when all are in the file."""

    def __init__(self, actors: rm.ActorMesh, method: str, per_actor: int, chunk: int) -> None:
        self.actors, self.method, self.per_actor, self.chunk = actors, method, per_actor, chunk
        self.rows = ACTORS * (max(1, per_actor // chunk) * chunk if method == "batches" else per_actor)

    def round(self) -> float:
        before = count_rows()
        t0 = time.perf_counter()
        args = (self.per_actor, self.chunk) if self.method == "batches" else (self.per_actor,)
        getattr(self.actors, self.method).call(*args).get(timeout=300)
        return self.rows / (wait_rows(before + self.rows) - t0)


def record_vs_append(n: int, rounds: int) -> tuple[list[float], list[float]]:
    """µs per ``record()`` and per plain append of the same row, rounds interleaved."""
    rec = rm.telemetry.record
    buf: list = []

    def plain(table: str, /, **row: object) -> None:
        buf.append((table, row))

    def block(fn) -> float:
        t0 = time.perf_counter()
        for i in range(n):
            fn("record_cost", reward=0.5, policy_version=i, length=17, env="cartpole", rollout_id="r")
        dt = (time.perf_counter() - t0) / n * 1e6
        buf.clear()
        return dt

    def recorded() -> float:
        dt = block(rec)
        rm.telemetry.flush()
        return dt

    block(plain), recorded()  # warm up: the table's types are learnt on its first row
    return interleave(rounds, lambda: block(plain), recorded)


def bench_spans(mesh: rm.ActorMesh, calls: int, rounds: int) -> tuple[list[float], list[float]]:
    point = mesh.slice(procs=0)

    def loop(on: bool) -> float:
        assert point.spans.call_one(on).get(), "span sink not installed in the worker"
        ep = point.busy
        t0 = time.perf_counter()
        for _ in range(calls):
            ep.call_one(1.0).get()
        return (time.perf_counter() - t0) / calls * 1e3

    loop(True), loop(False)  # warm up
    return interleave(rounds, lambda: loop(False), lambda: loop(True))


def bench_groupby(n: int) -> tuple[float, float, int]:
    rm.telemetry.end_run()
    run_id = rm.telemetry.start_run(config={"benchmark": "groupby"})
    for off in range(0, n, 1_000_000):
        rm.telemetry.record_batch("rollouts", rollout_columns(min(1_000_000, n - off), seed=off))
    rm.telemetry.flush(timeout=300)
    sql = "SELECT policy_version, avg(reward) AS r, count(*) AS n FROM rollouts GROUP BY 1 ORDER BY 1"

    def timed(run: str | None) -> float:
        ts = []
        for _ in range(3):
            t0 = time.perf_counter()
            out = rm.telemetry.query(sql, run=run)
            ts.append(time.perf_counter() - t0)
        assert sum(out.column("n").to_pylist()) == n
        return min(ts)

    live = timed(None)
    rm.telemetry.end_run()
    return live, timed(run_id), n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5, help="interleaved floor/subject rounds per figure")
    ap.add_argument("--rows", type=int, default=200_000, help="rows per actor per ingest round")
    ap.add_argument("--groupby-rows", type=int, default=10_000_000)
    ap.add_argument("--quick", action="store_true", help="50k rows per actor, 2 M group-by rows, 3 rounds")
    add_common_args(ap)
    args = ap.parse_args()
    if args.quick:
        args.rows, args.groupby_rows, args.rounds = 50_000, 2_000_000, 3
    if args.smoke:
        args.rows, args.groupby_rows, args.rounds = 5_000, 100_000, 2
    chunk = min(50_000, args.rows)
    report = Report("telemetry", smoke=args.smoke, args=vars(args))
    banner("rlmesh telemetry: ingest, record(), spans, group-by", "duckdb", "pyarrow")

    plain_us, rec_us = record_vs_append(20_000 if args.smoke else 200_000, args.rounds)
    print(f"record() in the caller: {statistics.median(rec_us):.2f} µs; a plain append of the same row: "
          f"{statistics.median(plain_us):.2f} µs (medians of {args.rounds} rounds)")
    r = report.ratio("record_vs_plain_append", [a / b for a, b in zip(rec_us, plain_us)], "record() µs / append µs")
    report.target("record_vs_plain_append", r.median, 2.0)
    report.row(figure="record() µs", rlmesh=statistics.median(rec_us), floor=statistics.median(plain_us))

    floor = Floor(args.rows, chunk)
    with rm.this_host().spawn_procs(per_host={"procs": ACTORS}, name="producers", env=KEEPALIVE) as procs:
        actors = procs.spawn("producer", Producer)
        actors.busy.call(0.0).get()
        batch = Ingest(actors, "batches", args.rows, chunk)
        batch.round()  # warm up: the table is created, the writers connect
        fl, sub = interleave(args.rounds, floor.round, batch.round)
        print(f"ingest, {ACTORS} actors, record_batch of {chunk:,} rows: {statistics.median(sub):,.0f} rows/s; "
              f"DuckDB append of the same rows: {statistics.median(fl):,.0f} rows/s")
        r = report.ratio("ingest_record_batch", [s / f for s, f in zip(sub, fl)], "rlmesh rows/s / DuckDB rows/s")
        report.target("ingest_record_batch", r.median, 0.7, at_most=False)
        report.row(figure="ingest record_batch rows/s", rlmesh=statistics.median(sub), floor=statistics.median(fl))
        per_row = Ingest(actors, "rows", max(1000, args.rows // 10), chunk)
        fl, sub = interleave(max(2, args.rounds // 2), floor.round, per_row.round)
        print(f"ingest, {ACTORS} actors, one record() per row: {statistics.median(sub):,.0f} rows/s")
        report.ratio("ingest_record_per_row", [s / f for s, f in zip(sub, fl)], "rlmesh rows/s / DuckDB rows/s")
        report.row(figure="ingest record() rows/s", rlmesh=statistics.median(sub), floor=statistics.median(fl))
    floor.con.close()

    with rm.this_host().spawn_procs(per_host={"procs": 1}, name="spans", env=KEEPALIVE) as p:
        off, on = bench_spans(p.spawn("busy", Producer), 20 if args.smoke else 150, 2 if args.smoke else 16)
    print(f"1 ms endpoint loop, spans on / off: {statistics.median(on):.3f} / {statistics.median(off):.3f} ms per call")
    r = report.ratio("spans_on_vs_off", [a / b for a, b in zip(on, off)], "ms per call with spans / without")
    report.target("spans_on_vs_off", r.median, 1.05)

    live, cold, n = bench_groupby(args.groupby_rows)
    print(f"GROUP BY over {n / 1e6:.1f} M rollouts rows: live {live * 1e3:7.1f} ms, "
          f"from the file after the run {cold * 1e3:.1f} ms (target < 1000 ms)")
    report.row(figure="group-by ms", live=live * 1e3, file=cold * 1e3, rows=n)
    report.write(args.json)
    if not args.smoke:
        import observe  # deferred: benchmarks/observe.py, run after these (log capture, stacks, MCP)

        observe.main(args.quick, report)
        report.write(args.json)


if __name__ == "__main__":
    main()
