"""Recovery under faults: ``ppo_cartpole`` and ``grpo_addition`` run clean, with generators
(and, for GRPO, reward procs) SIGKILLed on a schedule, and with the trainer SIGKILLed once
mid-run, in the same invocation; each variant against the clean run measured here.

Claim (targets, docs/faults.md): a killed generator or reward proc serves again in < 1 s
(median ``serving_s``); a killed trainer serves again in < 3 s plus its checkpoint load;
no work item is lost (``lost`` = 0 in every variant: every issued id ends exactly once); PPO's
final greedy return stays >= 475 in every variant; with generator kills every ~15 s the
wall time stays within 1.3x of the clean run.

Protocol: each variant is its own ``python -m rlmesh.cli run`` subprocess (its own
controller, procs and telemetry run, in a fresh ``RLMESH_RUNS_DIR``) with a fixed budget
and no early stop (``eval.target=null``), so the variants do the same work:

- PPO: ``recipe=ppo_cartpole trainer.total_steps=--ppo-steps generator.replicas=2``.
- GRPO: ``recipe=grpo_addition steps=--grpo-steps prompts_per_step=32
  generator.samples_per_prompt=8 trainer.sft_steps=200 eval.every=max(20, steps // 8)
  eval.episodes=200 generator.replicas=2 reward.replicas=2``. At this size a step takes
  ~0.12-0.15 s here, so the default 400 steps make a ~1 minute loop: long enough for a few
  kills every 15 s (60 steps would be ~8 s, shorter than the first kill).
- variants: ``none``; ``faults.kill=generator faults.every_s=--every-s``; ``faults.kill=trainer
  faults.max_faults=1 faults.start_after_s=`` 40% of the clean run's wall time; and for GRPO
  ``faults.kill=reward faults.every_s=--every-s``. All with ``run.max_restarts=-1`` so a proc hit
  more than three times is still restarted.

Numbers come from each run's ``telemetry.duckdb`` (read-only, after the run) and
``result.json``: "wall s" is the controller loop's wall time (``result.json`` ``wall_s``; the
subprocess's whole time, start-up included, is "proc s"); "final eval" the last ``evals`` row
by ts (PPO: greedy mean return over 20 fresh episodes; GRPO: held-out mean reward); "train
reward" (GRPO) the mean of ``rollout/reward_mean`` over the last 10% of the train steps (at
least 5); the work
columns :data:`rlmesh.rl.run.report.WORK_ACCOUNT_SQL`; "kills" the ``fault_injected`` rows;
"serving s" the ``serving_s`` of ``actors`` ``restarted`` rows (the fault to the replacement serving)
and, beside it, "recovery s" the ``recovery_s`` of ``recovered`` rows (the fault on to the replacement's
first accepted progress), each as a spread over the variant's kills (median, min-max, n) and split by
the role the proc hosts (its ``actors`` column); "ckpt load s" the ``checkpoints`` ``load`` rows; and for the trainer, the
seconds from its ``restarted`` row (the replacement serving) to the next ``train_steps`` row, the time
a trainer that is back but not training yet costs the run.

Measured for the trainer's stall after a restart (fe836cd: a sample call the dead trainer left
waiting took the next batch): GRPO as above with ``steps=200 faults.kill=trainer faults.every_s=6
faults.max_faults=4``, the tree before and after the fix in alternation, 2 runs each (8 kills), load
26-50: seconds from the restarted trainer serving to its next train step, before 1.6-23.5 (median
11.4), after 0.8-8.0 (median 2.7); recovery_s 1.1-2.7 s in both.

It measures, it does not assert speed: it exits 0 whatever the targets say, and 1 only if a
run failed or lost work (``lost`` > 0).

Run: ``python benchmarks/recovery.py`` (about 10-15 minutes on the shared 2-core machine);
``--only ppo|grpo``; ``--quick`` for a smoke run (PPO 60000 steps, GRPO 15 steps, faults
every 4 s).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

import duckdb

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, add_common_args, banner  # noqa: E402

from rlmesh.rl.run.report import WORK_ACCOUNT_SQL  # noqa: E402

PPO_TARGET = 475.0
GEN_RECOVERY_S = 1.0
TRAINER_RECOVERY_S = 3.0
WALL_RATIO = 1.3
TRAINER_KILL_AT = 0.4  # of the clean run's wall time

PPO_BASE = ["recipe=ppo_cartpole", "eval.target=null", "generator.replicas=2"]
GRPO_BASE = ["recipe=grpo_addition", "eval.target=null", "prompts_per_step=32", "generator.samples_per_prompt=8",
             "trainer.sft_steps=200", "eval.episodes=200", "generator.replicas=2",
             "reward.replicas=2"]
KEEP: str | None = None  # --keep

COMMON = ["run.progress=false", "run.max_restarts=-1", "faults.seed=1"]


def _rows(con: duckdb.DuckDBPyConnection, sql: str) -> list[dict]:
    cur = con.execute(sql)
    names = [d[0] for d in cur.description]
    return [dict(zip(names, r)) for r in cur.fetchall()]


def _median(xs: list[float]) -> float | None:
    return statistics.median(xs) if xs else None


def read_run(db: str, result: dict) -> dict:
    """The numbers of one finished run, from its telemetry database and result.json."""
    con = duckdb.connect(db, read_only=True)
    try:
        work = {f"work_{k}": int(v or 0) for k, v in _rows(con, WORK_ACCOUNT_SQL)[0].items()}
        last = _rows(con, "SELECT metric, value, step FROM evals ORDER BY policy_version DESC, ts DESC LIMIT 1")
        kills = _rows(con, "SELECT count(*) AS n FROM actors WHERE event = 'fault_injected'")[0]["n"]
        hosted = "(SELECT max(a.actors) FROM actors a WHERE a.proc = r.proc AND a.actors IS NOT NULL) AS hosted"
        restarts = _rows(con, f"SELECT r.serving_s, {hosted} FROM actors r WHERE r.event = 'restarted' ORDER BY r.ts")
        recovered = _rows(con, f"SELECT r.recovery_s, {hosted} FROM actors r WHERE r.event = 'recovered' ORDER BY r.ts")
        # seconds from each restart (its replacement serving) to the next train step: a restarted trainer
        # that serves but does not train stalls the run while serving_s says it is back (recovery_s does not)
        to_step = [r["gap"] for r in _rows(con, "SELECT (SELECT epoch(min(s.ts)) FROM train_steps s WHERE s.ts > r.ts) "
                                               "- epoch(r.ts) AS gap FROM actors r WHERE r.event = 'restarted' "
                                               "ORDER BY r.ts")]
        loads = [r["duration_s"] for r in _rows(con, "SELECT duration_s FROM checkpoints WHERE event = 'load' "
                                                     "ORDER BY ts")]
        n_steps = _rows(con, "SELECT count(*) AS n FROM train_steps")[0]["n"]
        tail = max(5, n_steps // 10)  # the last 10% of the train steps: one step's mean is noisy
        metrics = [r["metrics"] for r in _rows(con, f"SELECT metrics FROM train_steps ORDER BY ts DESC LIMIT {tail}")]
    finally:
        con.close()
    serve: dict[str, list[float]] = {"generator": [], "reward": [], "trainer": [], "other": []}
    rec: dict[str, list[float]] = {k: [] for k in serve}
    trainer_to_step: list[float] = []
    for r, gap in zip(restarts, to_step):
        role = _role(r["hosted"])
        if r["serving_s"] is not None:
            serve[role].append(float(r["serving_s"]))
        if role == "trainer" and gap is not None:
            trainer_to_step.append(float(gap))
    for r in recovered:
        if r["recovery_s"] is not None:
            rec[_role(r["hosted"])].append(float(r["recovery_s"]))
    rewards = []
    for m in metrics:
        m = json.loads(m) if isinstance(m, str) else (m or {})
        if m.get("rollout/reward_mean") is not None:
            rewards.append(float(m["rollout/reward_mean"]))
    return {**work, "wall_s": result.get("wall_s"), "kills": int(kills), "restarts": len(restarts),
            "eval": last[0]["value"] if last else None, "eval_metric": last[0]["metric"] if last else None,
            "train_reward": statistics.mean(rewards) if rewards else None,
            "serve": serve, "rec": rec, "ckpt_load": loads, "trainer_to_step": trainer_to_step}


def _role(hosted: str | None) -> str:
    """The role a proc hosts, from its ``actors`` column (``generator[0]``, ...)."""
    names = [a.strip() for a in (hosted or "").split(",")]
    return next((role for role in ("trainer", "generator", "reward") if any(a.startswith(role) for a in names)), "other")


def spread(xs: list[float]) -> str:
    """Median, min-max and count of one variant's kills (a median alone hides the slow restart)."""
    if not xs:
        return "none"
    return f"median {statistics.median(xs):.2f} s ({min(xs):.2f}-{max(xs):.2f}, n={len(xs)})"


def run_variant(name: str, overrides: list[str], timeout: float) -> dict:
    """One ``rlmesh run`` subprocess in a fresh runs directory; its numbers, or ``failed`` with why."""
    with tempfile.TemporaryDirectory(prefix="rlmesh-recovery-") as tmp:
        if KEEP:
            tmp = os.path.join(KEEP, f"{overrides[0].split('=', 1)[1]}-{name}")
            os.makedirs(tmp, exist_ok=True)
        env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID")}
        env["RLMESH_RUNS_DIR"] = os.path.join(tmp, "runs")
        cmd = [sys.executable, "-m", "rlmesh.cli", "run", *overrides]
        t0 = time.perf_counter()
        try:
            out = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=timeout)
            rc, stderr = out.returncode, out.stderr
        except subprocess.TimeoutExpired as exc:
            rc, stderr = "timeout", (exc.stderr or b"").decode(errors="replace") if isinstance(exc.stderr, bytes) \
                else (exc.stderr or "")
        proc_s = time.perf_counter() - t0
        runs = [d for d in glob.glob(os.path.join(tmp, "runs", "*")) if not os.path.islink(d)]  # not runs/latest
        results = [f for d in runs for f in glob.glob(os.path.join(d, "result.json"))]
        dbs = [f for d in runs for f in glob.glob(os.path.join(d, "telemetry.duckdb"))]
        row: dict[str, Any] = {"name": name, "proc_s": proc_s, "cmd": "rlmesh run " + " ".join(overrides)}
        if rc != 0 or len(results) != 1 or len(dbs) != 1:
            row.update(failed=f"rc={rc}, {len(results)} result.json, {len(dbs)} telemetry.duckdb",
                       stderr=stderr[-3000:])
            return row
        with open(results[0]) as f:
            result = json.load(f)
        try:
            row.update(read_run(dbs[0], result))
        except Exception as exc:  # noqa: BLE001 - report, do not crash the other variants
            row.update(failed=f"reading the telemetry: {type(exc).__name__}: {exc}", stderr=stderr[-3000:])
        return row


def fmt(x: float | int | None, spec: str) -> str:
    return "—" if x is None else format(x, spec)


def print_row_line(r: dict) -> None:
    if "failed" in r:
        print(f"  {r['name']:10s} FAILED ({r['failed']}) after {r['proc_s']:.1f} s\n    command: {r['cmd']}\n"
              f"    stderr tail:\n" + "\n".join("      " + ln for ln in r["stderr"].splitlines()[-25:]), flush=True)
    else:
        print(f"  {r['name']:10s} done: wall {r['wall_s']:.1f} s (proc {r['proc_s']:.1f} s), kills {r['kills']}, "
              f"restarts {r['restarts']}, final eval {fmt(r['eval'], '.3f')}, lost {r['work_lost']}", flush=True)


def print_table(title: str, rows: list[dict], grpo: bool) -> None:
    clean = next((r for r in rows if r["name"] == "none" and "failed" not in r), None)
    cols = ["variant", "wall s", "proc s", "/clean", "final eval"] + (["train rew"] if grpo else []) + \
           ["issued", "completed", "re-issued", "dropped", "lost", "twice", "kills", "serving s", "recovery s",
            "trainer serv s", "ckpt load s"]
    widths = [max(len(c), 10) for c in cols]
    widths[0] = 10
    print(f"\n## {title}")
    print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cols, widths))))
    for r in rows:
        if "failed" in r:
            cells = [r["name"], "FAILED"] + [""] * (len(cols) - 2)
        else:
            ratio = r["wall_s"] / clean["wall_s"] if clean else None
            serve = r["serve"]["generator"] + r["serve"]["reward"]
            rec = r["rec"]["generator"] + r["rec"]["reward"]
            cells = [r["name"], fmt(r["wall_s"], ".1f"), fmt(r["proc_s"], ".1f"), fmt(ratio, ".2f"),
                     fmt(r["eval"], ".3f" if grpo else ".1f")]
            if grpo:
                cells.append(fmt(r["train_reward"], ".3f"))
            cells += [str(r["work_issued"]), str(r["work_completed"]), str(r["work_reissued"]),
                      str(r["work_dropped"]), str(r["work_lost"]), str(r["work_counted_twice"]), str(r["kills"]),
                      fmt(_median(serve), ".2f"), fmt(_median(rec), ".2f"), fmt(_median(r["serve"]["trainer"]), ".2f"),
                      fmt(_median(r["ckpt_load"]), ".2f")]
        print("  ".join(c.rjust(w) if i else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))))
    print("  per role, over each variant's kills: serving_s (to the replacement serving) | recovery_s (to its "
          "first accepted progress)")
    for r in rows:
        for role in ("generator", "reward", "trainer", "other"):
            if "failed" not in r and (r["serve"][role] or r["rec"][role]):
                print(f"    {r['name']:10s} {role:9s}  serving {spread(r['serve'][role])} | "
                      f"recovery {spread(r['rec'][role])}")


def targets(rows: list[dict], grpo: bool) -> None:
    by = {r["name"]: r for r in rows}
    ok = lambda cond: "met    " if cond else "NOT met"  # noqa: E731

    def good(name: str) -> dict | None:
        r = by.get(name)
        return r if r is not None and "failed" not in r else None

    print()
    for role in ("generator", "reward"):
        r = good(role)
        if role not in by:
            continue
        if r is None:
            print(f"  NOT met  {role} recovery < {GEN_RECOVERY_S:.0f} s: the run failed")
            continue
        med = _median(r["serve"][role])
        print(f"  {ok(med is not None and med < GEN_RECOVERY_S)}  {role} serving again < {GEN_RECOVERY_S:.0f} s: "
              f"serving_s {spread(r['serve'][role])}; recovery_s (to first progress) {spread(r['rec'][role])}; "
              f"{r['kills']} kills")
    r = good("trainer")
    if "trainer" not in by:
        pass
    elif r is None:
        print(f"  NOT met  trainer recovery < {TRAINER_RECOVERY_S:.0f} s + checkpoint load: the run failed")
    else:
        tr, load = _median(r["serve"]["trainer"]), _median(r["ckpt_load"]) or 0.0
        print(f"  {ok(tr is not None and tr < TRAINER_RECOVERY_S + load)}  trainer serving again < "
              f"{TRAINER_RECOVERY_S:.0f} s + checkpoint load: serving_s {spread(r['serve']['trainer'])}, recovery_s "
              f"{spread(r['rec']['trainer'])}, checkpoint load {fmt(_median(r['ckpt_load']), '.2f')} s "
              f"({r['kills']} kills)")
        print(f"  (info)   then to the first train step: "
              f"{', '.join(f'{x:.2f}' for x in r['trainer_to_step']) or 'none'} s after each restarted trainer served")
    done = [r for r in rows if "failed" not in r]
    failed = [r["name"] for r in rows if "failed" in r]
    lost = {r["name"]: r["work_lost"] for r in done}
    twice = {r["name"]: r["work_counted_twice"] for r in done}
    print(f"  {ok(not failed and not any(lost.values()))}  lost = 0 in every variant: "
          + ", ".join(f"{k} {v}" for k, v in lost.items()) + (f"; failed: {', '.join(failed)}" if failed else ""))
    print(f"  {ok(not failed and not any(twice.values()))}  counted twice = 0 in every variant: "
          + ", ".join(f"{k} {v}" for k, v in twice.items()))
    evals = ", ".join(f"{r['name']} {fmt(r['eval'], '.3f' if grpo else '.1f')}" for r in done)
    if not grpo:
        print(f"  {ok(not failed and all(r['eval'] is not None and r['eval'] >= PPO_TARGET for r in done))}  "
              f"final return >= {PPO_TARGET:.0f} in every variant: {evals}")
    else:
        clean = good("none")
        diffs = ", ".join(f"{r['name']} {r['eval'] - clean['eval']:+.3f}" for r in done
                          if clean and r is not clean and r["eval"] is not None and clean["eval"] is not None)
        print(f"  (info)   held-out mean reward: {evals}" + (f"; vs clean: {diffs}" if diffs else ""))
        print("  (info)   train reward (last 10% of steps): "
              + ", ".join(f"{r['name']} {fmt(r['train_reward'], '.3f')}" for r in done))
    clean, gen = good("none"), good("generator")
    if clean and gen:
        ratio = gen["wall_s"] / clean["wall_s"]
        print(f"  {ok(ratio <= WALL_RATIO)}  wall with generator kills <= {WALL_RATIO}x clean: {gen['wall_s']:.1f} s / "
              f"{clean['wall_s']:.1f} s = {ratio:.2f}x ({gen['kills']} kills)")
    else:
        print(f"  NOT met  wall with generator kills <= {WALL_RATIO}x clean: a run failed")


def run_recipe(title: str, base: list[str], roles: list[str], every_s: float, timeout: float, grpo: bool,
               report: Report) -> list[dict]:
    print(f"\n# {title}: rlmesh run {' '.join(base + COMMON)}", flush=True)
    base = base + COMMON
    rows = [run_variant("none", base, timeout)]
    print_row_line(rows[0])
    clean_wall = rows[0].get("wall_s") or 30.0
    for role in roles:
        if role == "trainer":
            at = round(TRAINER_KILL_AT * clean_wall, 1)
            faults = ["faults.kill=trainer", "faults.max_faults=1", f"faults.start_after_s={at}"]
        else:
            faults = [f"faults.kill={role}", f"faults.every_s={every_s}"]
        rows.append(run_variant(role, base + faults, timeout))
        print_row_line(rows[-1])
    print_table(title, rows, grpo)
    targets(rows, grpo)
    clean = rows[0] if "failed" not in rows[0] else None
    for r in rows:
        report.row(recipe=title, **{k: v for k, v in r.items() if k not in ("rec", "serve")},
                   serving_s=r.get("serve"), recovery_s=r.get("rec"))
        if clean and r is not clean and "failed" not in r:  # the floor: the same recipe without faults
            ratio = report.ratio(f"{title.split()[0]}_{r['name']}_kills_wall_vs_clean", [r["wall_s"] / clean["wall_s"]],
                                 "wall s with faults / clean wall s, one run each")
            if r["name"] == "generator":
                report.target(f"{title.split()[0]}_wall_with_generator_kills", ratio.median, WALL_RATIO)
            serve = r["serve"].get(r["name"]) or []
            if serve and r["name"] in ("generator", "reward"):
                report.target(f"{title.split()[0]}_{r['name']}_recovery", statistics.median(serve), GEN_RECOVERY_S,
                              unit="s")
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=["ppo", "grpo"], help="run one recipe only")
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: ppo 60000 steps, grpo 15 steps, faults every 4 s")
    parser.add_argument("--ppo-steps", type=int, default=None, help="PPO trainer.total_steps (default 300000)")
    parser.add_argument("--grpo-steps", type=int, default=None, help="GRPO steps (default 400)")
    parser.add_argument("--every-s", type=float, default=None, help="seconds between generator/reward kills (15)")
    parser.add_argument("--timeout", type=float, default=900, help="seconds before one run counts as failed")
    parser.add_argument("--keep", metavar="DIR", help="keep each run's directory under DIR/<recipe>-<variant>")
    add_common_args(parser)
    args = parser.parse_args()
    roles = {"ppo": ["generator", "trainer"], "grpo": ["generator", "trainer", "reward"]}
    if args.smoke:  # PPO only, clean and with generator kills, a short fixed budget
        args.only, args.ppo_steps, args.every_s = "ppo", args.ppo_steps or 4096, args.every_s or 0.5
        roles["ppo"] = ["generator"]
    report = Report("recovery", smoke=args.smoke, args=vars(args))
    global KEEP
    KEEP = os.path.abspath(args.keep) if args.keep else None
    ppo_steps = args.ppo_steps or (60_000 if args.quick else 300_000)
    grpo_steps = args.grpo_steps or (15 if args.quick else 400)
    every_s = args.every_s or (4.0 if args.quick else 15.0)

    banner("recovery under faults: ppo_cartpole and grpo_addition" + (" (--quick)" if args.quick else ""),
           "torch", "duckdb")
    print(f"# load: {os.getloadavg()}; kills every {every_s:g} s; trainer killed once at "
          f"{TRAINER_KILL_AT:.0%} of the clean wall time")
    rows: list[dict] = []
    if args.only in (None, "ppo"):
        rows += run_recipe("ppo_cartpole", PPO_BASE + [f"trainer.total_steps={ppo_steps}"],
                           roles["ppo"], every_s, args.timeout, grpo=False, report=report)
    if args.only in (None, "grpo"):
        rows += run_recipe("grpo_addition (small)",
                           GRPO_BASE + [f"steps={grpo_steps}", f"eval.every={max(20, grpo_steps // 8)}"],
                           roles["grpo"], every_s, args.timeout, grpo=True, report=report)
    report.write(args.json)
    bad = [r["name"] for r in rows if "failed" in r or r.get("work_lost", 0) > 0]
    if bad:
        print(f"\nexit 1: {len(bad)} run(s) failed or lost work")
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
