"""Memory soak: RSS of every proc over a whole recipe run, and its slope per train step and per minute.

Claim (issue 37): no proc of a recipe run grows without bound. Before commit 91a3fa0 the generator
of ``grpo_addition`` grew by about 45-70 MB a step (17.6-18.4 GB RSS by step 400) because its
prefix cache held far more than its cap said; with the cap on the memory it holds, every proc,
the generator included, should be flat once training runs.

Protocol: one ``python -m rlmesh.cli run`` subprocess (``recipe=grpo_addition`` as shipped, or the
recipe and overrides given on the command line) in a fresh runs directory, with
``telemetry.proc_health_interval_s=--interval``. Afterwards its ``telemetry.duckdb`` is opened
read-only and for each proc (named by the actors it hosted, from the ``actors`` table):

- "start MB": RSS at the first train step (after warm start and model load: what training starts from);
- "peak MB" and "end MB": the largest and the last sample;
- "MB/step" and "MB/min": least-squares slopes of RSS over the train phase (the samples between the
  first and the last train step), against the number of train steps done at each sample and
  against time;
- "warning": the run's own growth warning (``proc_health.warning``), if any.

The load (1 min average from ``host_health``: mean and max over the run) and the machine and
versions are printed with it; everything also goes to ``--json`` (default ``soak_memory.json``).
It measures, it does not judge: it exits 0 unless the run failed.

Measured on the shared 2-core machine (load 5-6): as shipped, 400 steps, the generator goes
669 -> 718 (peak) -> 690 MB, -0.01 MB/step, and every other proc stays under +0.25 MB/step with no
growth warning. The same tree with the prefix cache of before 91a3fa0, ``steps=250``: the generator
goes 693 -> 11,376 MB, +44.0 MB/step (+3.8 GB/min), and its own ``proc_health`` warning fires
(with ``RLMESH_RSS_GROWTH_WINDOW_S=60``).

Run: ``python benchmarks/soak_memory.py`` (grpo_addition as shipped: about 5.5 minutes on 2
cores at load 5); ``--smoke`` for a few steps only; ``python benchmarks/soak_memory.py steps=100``
for overrides of the default recipe; ``python benchmarks/soak_memory.py ppo_cartpole
trainer.total_steps=200000`` for another recipe.
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import tempfile
import time
from typing import Any

import duckdb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, banner, versions  # noqa: E402

from rlmesh.telemetry.proc_health import slope  # noqa: E402

MB = 1 << 20
SMOKE = ["steps=5", "eval.every=1000", "eval.episodes=20", "trainer.sft_steps=20"]
"""--smoke for the LLM recipes: a handful of steps (gym recipes: give their budget yourself)."""

PROC_SQL = """
SELECT p.proc, p.mesh, p.rank, epoch(p.ts) AS t, p.rss, p.warning,
       (SELECT count(*) FROM train_steps s WHERE s.ts <= p.ts) AS steps_done
FROM proc_health p ORDER BY p.proc, p.ts"""
ACTORS_SQL = "SELECT proc, arg_max(actors, ts) AS actors FROM actors WHERE actors IS NOT NULL GROUP BY proc"


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def read_soak(db: str) -> dict[str, Any]:
    """Per-proc RSS numbers of one finished run (see the module docstring)."""
    con = duckdb.connect(db, read_only=True)
    try:
        samples = _rows(con, PROC_SQL)
        actors = {r["proc"]: r["actors"] for r in _rows(con, ACTORS_SQL)}
        span = _rows(con, "SELECT epoch(min(ts)) AS t0, epoch(max(ts)) AS t1, count(*) AS n FROM train_steps")[0]
        load = _rows(con, "SELECT avg(load_1m) AS mean, max(load_1m) AS max FROM host_health")[0]
        host = _rows(con, "SELECT max(rss) AS peak_job_rss, min(mem_available) AS min_available FROM host_health")[0]
    finally:
        con.close()
    t0, t1 = span["t0"], span["t1"]
    by_proc: dict[str, list[dict]] = {}
    for s in samples:
        by_proc.setdefault(s["proc"], []).append(s)
    procs = []
    for proc, ss in by_proc.items():
        train = [s for s in ss if t0 is not None and t0 <= s["t"] <= t1]
        first = train[0] if train else ss[0]
        procs.append({
            "proc": proc, "actors": actors.get(proc) or proc, "samples": len(ss), "train_samples": len(train),
            "start_mb": first["rss"] / MB, "peak_mb": max(s["rss"] for s in ss) / MB, "end_mb": ss[-1]["rss"] / MB,
            "mb_per_step": slope([float(s["steps_done"]) for s in train], [s["rss"] / MB for s in train])
            if len(train) >= 3 else None,
            "mb_per_min": 60 * slope([s["t"] for s in train], [s["rss"] / MB for s in train]) if len(train) >= 3 else None,
            "warning": next((s["warning"] for s in ss if s["warning"]), None),
        })
    procs.sort(key=lambda p: -p["peak_mb"])
    return {"train_steps": span["n"], "train_s": (t1 - t0) if t0 is not None else None, "procs": procs,
            "load_1m_mean": load["mean"], "load_1m_max": load["max"],
            "host_peak_job_rss_mb": (host["peak_job_rss"] or 0) / MB,
            "host_min_available_mb": (host["min_available"] or 0) / MB}


def fmt(x: float | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def print_soak(r: dict[str, Any]) -> None:
    print(f"\n## RSS per proc over {r['train_steps']} train steps ({fmt(r['train_s'], '.0f')} s of training)")
    cols = ["proc (actors)", "start MB", "peak MB", "end MB", "MB/step", "MB/min", "samples", "warning"]
    print(f"{cols[0]:32s}" + "".join(f"{c:>10s}" for c in cols[1:7]) + f"  {cols[7]}")
    for p in r["procs"]:
        name = f"{p['proc']} ({p['actors']})" if p["actors"] != p["proc"] else p["proc"]
        print(f"{name[:32]:32s}{p['start_mb']:10.0f}{p['peak_mb']:10.0f}{p['end_mb']:10.0f}"
              f"{fmt(p['mb_per_step'], '+.2f'):>10s}{fmt(p['mb_per_min'], '+.1f'):>10s}{p['samples']:10d}  "
              f"{p['warning'] or '-'}")
    print(f"host: peak job RSS {r['host_peak_job_rss_mb']:.0f} MB, least memory available "
          f"{r['host_min_available_mb']:.0f} MB; load (1 min) mean {fmt(r['load_1m_mean'], '.1f')}, "
          f"max {fmt(r['load_1m_max'], '.1f')}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("recipe", nargs="?", default="grpo_addition", help="recipe to run (default grpo_addition)")
    ap.add_argument("overrides", nargs="*", help="Hydra overrides for the run, e.g. steps=200")
    ap.add_argument("--smoke", action="store_true", help="a few steps only (" + " ".join(SMOKE) + ")")
    ap.add_argument("--rss-target", type=float, default=1.5,
                    help="the most a proc's RSS may grow over the run, end / start of training (printed as a target)")
    ap.add_argument("--interval", type=float, help="seconds between proc_health samples (default 2; 0.5 with --smoke)")
    ap.add_argument("--timeout", type=float, default=3600, help="give the run up after this many seconds")
    ap.add_argument("--json", default="soak_memory.json", help="where to write the results (default soak_memory.json)")
    ap.add_argument("--keep", help="keep the run's directory here instead of a temporary one")
    args = ap.parse_args()
    if "=" in args.recipe:  # only overrides were given (`soak_memory.py steps=100`), or `recipe=NAME`
        key, _, value = args.recipe.partition("=")
        args.overrides, args.recipe = ([] if key == "recipe" else [args.recipe]) + args.overrides, \
            value if key == "recipe" else "grpo_addition"
    if args.interval is None:
        args.interval = 0.5 if args.smoke else 2.0

    banner("memory soak: RSS per proc over a recipe run", "torch", "duckdb", "psutil")
    report = Report("soak_memory", smoke=args.smoke, args=vars(args))
    print(f"# load at start (1/5/15 min): {' '.join(f'{x:.1f}' for x in os.getloadavg())}")
    overrides = [f"recipe={args.recipe}", *(SMOKE if args.smoke else []), *args.overrides, "run.progress=false",
                 f"telemetry.proc_health_interval_s={args.interval}"]
    print("# command: rlmesh run " + " ".join(overrides), flush=True)
    tmp_ctx = tempfile.TemporaryDirectory(prefix="rlmesh-soak-")
    tmp = args.keep or tmp_ctx.name
    os.makedirs(tmp, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID")}
    env["RLMESH_RUNS_DIR"] = os.path.join(tmp, "runs")
    t = time.perf_counter()
    try:
        out = subprocess.run([sys.executable, "-m", "rlmesh.cli", "run", *overrides], cwd=tmp, env=env,
                             capture_output=True, text=True, timeout=args.timeout)
        rc, stderr = out.returncode, out.stderr
    except subprocess.TimeoutExpired as exc:
        rc, stderr = "timeout", str(exc.stderr or "")
    wall = time.perf_counter() - t
    dbs = [f for f in glob.glob(os.path.join(tmp, "runs", "*", "telemetry.duckdb"))
           if not os.path.islink(os.path.dirname(f))]
    if rc != 0 or len(dbs) != 1:
        print(f"the run failed (rc={rc}, {len(dbs)} telemetry.duckdb) after {wall:.0f} s; stderr tail:\n{stderr[-3000:]}")
        return 1
    r = read_soak(dbs[0])
    print(f"# run: {wall:.0f} s in all (rlmesh run process), run dir {os.path.dirname(dbs[0])}"
          + ("" if args.keep else " (removed)"))
    print_soak(r)
    doc = {"benchmark": "soak_memory", "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": {
        "cores": os.cpu_count(), "load_at_start": os.getloadavg()}, "versions": versions("rlmesh", "torch", "duckdb"),
        "command": "rlmesh run " + " ".join(overrides), "wall_s": wall, **r}
    for p in r["procs"]:  # the floor is the proc itself at the start of training
        if p["start_mb"]:
            ratio = report.ratio(f"rss_end_vs_start_{p['proc']}", [p["end_mb"] / p["start_mb"]],
                                 "RSS at the end / at the start of training, one run")
            if not args.smoke:  # a few steps say nothing about growth
                report.target(f"rss_growth_{p['proc']}", ratio.median, args.rss_target)
    report.write(args.json, extra=doc)
    tmp_ctx.cleanup()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
