"""Run the benchmark set (or a named part of it) and write the JSON and the markdown table that
docs/performance.md shows.

    .venv/bin/python benchmarks/run_all.py                         # the core set, once (~30-60 min on 2 cores)
    .venv/bin/python benchmarks/run_all.py --runs 3 --out runs/bench   # three sittings: spreads across runs
    .venv/bin/python benchmarks/run_all.py --only telemetry weight_sync --runs 3
    .venv/bin/python benchmarks/run_all.py --smoke                 # two scripts' --smoke: checks the table builds
    .venv/bin/python benchmarks/run_all.py --smoke --all           # every script's --smoke, one table
    .venv/bin/python benchmarks/run_all.py --merge runs/full runs/quick --doc docs/benchmark-table.md
                                                       # one table from earlier sittings' results.json

Each script runs as a subprocess with its command from ``COMMANDS`` (the one docs/performance.md
gives), writes ``<out>/<run>/<script>.json`` through ``benchmarks/_common.Report``, and its output
goes to ``<out>/<run>/<script>.log``. Then ``<out>/table.md`` holds one row per ratio: the median of
the per-round ratios in each run, their range across runs, the p90, the load during the runs and
the command; and one row per target, met or not in each run. ``<out>/results.json`` holds every
script's JSON of every run. A script that fails is listed as failed with the tail of its log; the
others go on. ``--merge`` builds that table from the ``results.json`` of earlier invocations (every
row says how many runs it has), and ``--doc`` writes it as the page docs/performance.md links to.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, banner, load  # noqa: E402

HERE = Path(__file__).resolve().parent

# The command of each script in the full set: what docs/performance.md shows and its table is made of.
COMMANDS: dict[str, list[str]] = {
    "actor_latency": ["--rounds", "8", "--curve"],
    "weight_sync": ["--gib", "1", "--rounds", "5"],
    "telemetry": ["--rounds", "5"],
    "startup": ["--only", "spawn", "--runs", "5"],
    "weight_sync_first": ["--gib", "1"],
    "weight_sync_tcp_64mib": ["--tcp-only", "--gib", "0.0625", "--rounds", "5"],
    "weight_sync_tcp_0.5gib": ["--tcp-only", "--gib", "0.5", "--rounds", "5"],
    "weight_sync_tcp_1gib": ["--tcp-only", "--gib", "1", "--rounds", "5"],
    "actor_latency_paired": ["--rounds", "8"],
    "call_cpu": [],
    "telemetry_writers": ["--sizes", "8,64,256", "--seconds", "4"],
    "workspace_sync": ["--big-mib", "256", "--files", "10000", "--n", "1", "4", "--repeat", "3"],
    "control_plane_scale": ["--sizes", "8,64,256,1000", "--beats", "board", "--deaths", "5", "--idle-s", "3",
                            "--rounds", "3"],
    "failure_detection": ["--rounds", "5"],
    "real_deaths": ["--procs", "200", "--rounds", "10", "--load", "8", "--sim", "200"],
}
SMOKE_SET = ["telemetry", "tls_vs_curve"]
"""What ``--smoke`` alone runs (each script's own smoke runs in the tests already)."""
SCRIPT = {"weight_sync_tcp_64mib": "weight_sync", "weight_sync_tcp_0.5gib": "weight_sync",
          "weight_sync_tcp_1gib": "weight_sync"}
"""Entries that run another script with other options."""


def scripts() -> list[str]:
    """Every runnable script in benchmarks/ (a ``__main__`` block; not _helpers, not this one)."""
    return sorted(p.stem for p in HERE.glob("*.py") if not p.name.startswith("_") and p.stem != "run_all"
                  and 'if __name__ == "__main__"' in p.read_text())


def run_one(name: str, smoke: bool, run_dir: Path, timeout: float) -> dict:
    script = SCRIPT.get(name, name)
    args = ["--smoke"] if smoke else COMMANDS.get(name, [])
    out, log = run_dir / f"{name}.json", run_dir / f"{name}.log"
    cmd = [sys.executable, str(HERE / f"{script}.py"), *args, "--json", str(out)]
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID")}
    env["PYTHONPATH"] = os.pathsep.join([str(HERE.parent), *filter(None, [env.get("PYTHONPATH")])])
    t0, load0 = time.perf_counter(), load()
    with open(log, "w") as f:
        try:
            rc = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout, env=env,
                                cwd=run_dir).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
    wall = time.perf_counter() - t0
    command = " ".join(["python", f"benchmarks/{script}.py", *args])
    if rc != 0 or not out.exists():
        tail = log.read_text()[-1500:]
        print(f"  {name}: FAILED ({rc}) after {wall:.0f} s; log {log}", flush=True)
        return {"name": name, "command": command, "failed": str(rc), "tail": tail, "wall_s": wall}
    data = json.loads(out.read_text())
    print(f"  {name}: {wall:.0f} s, {len(data['ratios'])} ratios, {len(data['targets'])} targets "
          f"(load {load0:.1f} -> {load():.1f})", flush=True)
    return {"name": name, "command": command, "wall_s": wall, **data}


def spread(xs: list[float]) -> str:
    if not xs:
        return "—"
    lo, hi = min(xs), max(xs)
    return f"{lo:.2f}" if abs(hi - lo) < 0.005 else f"{lo:.2f}–{hi:.2f}"


def table(runs: list[list[dict]]) -> str:
    """One markdown table of ratios and one of targets, each figure's spread over the runs."""
    ratios: dict[tuple[str, str], dict] = {}
    targets: dict[tuple[str, str], dict] = {}
    failed: list[str] = []
    for results in runs:
        for res in results:
            if "failed" in res:
                failed.append(f"{res['name']} ({res['failed']})")
                continue
            loads = [res["load_start"], res["load_end"]]
            for r in res["ratios"]:
                cell = ratios.setdefault((res["name"], r["name"]), {"medians": [], "p90s": [], "loads": [],
                                                                    "unit": r["unit"], "command": res["command"],
                                                                    "rounds": 0})
                cell["medians"].append(r["median"])
                cell["p90s"].append(r["p90"])
                cell["loads"] += loads
                cell["rounds"] += len(r["rounds"])
            for t in res["targets"]:
                cell = targets.setdefault((res["name"], t["name"]), {"measured": [], "met": [], "loads": [],
                                                                     "target": t["target"], "at_most": t["at_most"],
                                                                     "unit": t.get("unit", "x")})
                cell["measured"].append(t["measured"])
                cell["met"].append(t["met"])
                cell["loads"] += loads
    lines = [f"ratios over {len(runs)} run(s): the median of each run's per-round ratios (range across the runs "
             "that have it), their p90 (the worst run's), the runs and rounds in all, the load during the runs", "",
             "| script | figure | median (range) | p90 | runs | rounds | load | what over what |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for (script, name), c in ratios.items():
        lines.append(f"| {script} | {name} | {spread(c['medians'])} | {max(c['p90s']):.2f} | {len(c['medians'])} | "
                     f"{c['rounds']} | {spread(c['loads'])} | {c['unit']} |")
    lines += ["", "| script | target | measured (range) | target | met in runs | load |", "| --- | --- | --- | --- | --- | --- |"]
    for (script, name), c in targets.items():
        unit = "" if c["unit"] == "x" else c["unit"]
        lines.append(f"| {script} | {name} | {spread(c['measured'])}{unit or 'x'} | "
                     f"{'≤' if c['at_most'] else '≥'} {c['target']:g}{unit or 'x'} | {sum(c['met'])} of {len(c['met'])} | "
                     f"{spread(c['loads'])} |")
    commands = sorted({c["command"] for c in ratios.values()})
    lines += ["", "commands:", "", *[f"    {c}" for c in commands]]
    if failed:
        lines += ["", "failed: " + ", ".join(failed)]
    return "\n".join(lines) + "\n"


def page(runs: list[list[dict]], command: str, sittings: tuple[str, ...] | list[str] = ()) -> str:
    """``--doc``: the table as a docs page, with the machine and versions it ran on and the commands that made it."""
    done = [r for results in runs for r in results if "failed" not in r]
    machine = done[0].get("machine", "?") if done else "?"
    versions = sorted({r.get("versions", "") for r in done} - {""})
    return "\n".join([
        "# The benchmark set, every figure", "",
        f"Generated by `{command}` (do not edit: run it again) from the sittings below. One row per ratio and per target of every script",
        "in `benchmarks/run_all.py`'s set; docs/performance.md explains each figure, its baseline and what",
        "could flatter it. A row with fewer runs than the table comes from a part of the set run on its own.", "",
        *[f"- `{c}`" for c in sittings], *([""] if sittings else []),
        f"Machine: {machine}.", "", *[f"Versions: {v}." for v in versions[:1]], "", table(runs)])


def load_runs(dirs: list[str]) -> tuple[list[list[dict]], list[str]]:
    """``--merge``: the runs in each directory's ``results.json``, in the order given, and the command of
    each sitting (``run_all.py --runs N --out DIR``)."""
    runs: list[list[dict]] = []
    sittings = []
    for d in dirs:
        path = Path(d) / "results.json"
        if not path.exists():
            raise SystemExit(f"--merge: no {path} (a finished run_all.py --out {d} writes it)")
        these = json.loads(path.read_text())
        runs += these
        sittings.append(f"python benchmarks/run_all.py --runs {len(these)} --out {d}")
    return runs, sittings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--only", nargs="+", help=f"a part of the set (of: {', '.join(sorted({*COMMANDS, *scripts()}))})")
    ap.add_argument("--all", action="store_true", help="every script in benchmarks/, not only the core set")
    ap.add_argument("--runs", type=int, default=1, help="sittings of the whole set, one after the other")
    ap.add_argument("--out", default="runs/bench", help="where the logs, the JSON and table.md go")
    ap.add_argument("--timeout", type=float, default=3600, help="seconds before one script counts as failed")
    ap.add_argument("--smoke", action="store_true",
                    help=f"--smoke of {' and '.join(SMOKE_SET)} (with --all: of every script; or of --only's), one run")
    ap.add_argument("--json", default=None, help="also write results.json here")
    ap.add_argument("--merge", nargs="+", metavar="DIR",
                    help="run nothing: one table from these earlier --out directories' results.json")
    ap.add_argument("--doc", default=None, help="also write the table as a docs page here")
    args = ap.parse_args()
    if args.merge:
        runs, sittings = load_runs(args.merge)
        text = table(runs)
        out = Path(args.out).resolve()
        out.mkdir(parents=True, exist_ok=True)
        (out / "table.md").write_text(text)
        if args.doc:
            Path(args.doc).write_text(page(runs, "python benchmarks/run_all.py --merge " + " ".join(args.merge)
                                           + f" --doc {args.doc}", sittings))
        print(text)
        return
    if args.only:
        unknown = sorted(set(args.only) - {*COMMANDS, *scripts()})
        if unknown:
            ap.error(f"--only: no benchmark named {', '.join(unknown)}; the names are {', '.join(sorted({*COMMANDS, *scripts()}))}")
        names = args.only
    elif args.all:
        names = scripts() if args.smoke else sorted({*COMMANDS, *scripts()})
    elif args.smoke:
        names = SMOKE_SET
    else:
        names = list(COMMANDS)
    if args.smoke:
        names = list(dict.fromkeys(SCRIPT.get(n, n) for n in names))
        args.runs = 1
    banner(f"benchmarks/run_all.py: {len(names)} benchmark(s), {args.runs} run(s){', --smoke' if args.smoke else ''}")
    report = Report("run_all", smoke=args.smoke, args=vars(args))
    out = Path(args.out).resolve()
    runs: list[list[dict]] = []
    for i in range(args.runs):
        run_dir = out / f"run{i + 1}"
        run_dir.mkdir(parents=True, exist_ok=True)
        print(f"# run {i + 1} of {args.runs} (load {load():.1f})", flush=True)
        runs.append([])
        for n in names:  # the table is rewritten after each script: a long set can be read as it goes
            runs[-1].append(run_one(n, args.smoke, run_dir, args.timeout))
            (out / "table.md").write_text(table(runs))
    text = table(runs)
    (out / "table.md").write_text(text)
    (out / "results.json").write_text(json.dumps(runs, indent=1, default=str))
    if args.doc:
        Path(args.doc).write_text(page(runs, "python " + " ".join(["benchmarks/run_all.py", *sys.argv[1:]])))
    print("\n" + text)
    print(f"# wrote {out / 'table.md'} and {out / 'results.json'}")
    report.ratio("scripts_completed", [sum("failed" not in r for r in results) / len(results) for results in runs],
                 "scripts that completed / scripts run, per run")
    report.write(args.json, extra={"runs": runs, "table": text})
    if any("failed" in r for results in runs for r in results):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
