"""Start-up: ``spawn_procs(4)`` + spawn + first ``call()``, rlmesh vs Monarch vs Ray; and a whole
``ppo_cartpole`` process vs a whole Stable-Baselines3 process on CartPole with the same stop rule.

Claims (issue 16): rlmesh's start-up is <= 0.5x Monarch's, measured side by side; a recipe's
whole process (start-up, training, teardown) is <= SB3's whole process.

Protocol, ``spawn``: each framework runs in a fresh subprocess, one after the other, ``--runs``
rounds interleaved (so load changes hit every framework alike). Inside it the clock starts
before the framework is imported and stops when the first call's results are back from all
four actors ("first call"); then the procs are stopped ("teardown"). "process" is the parent's
wall clock for the whole subprocess (interpreter start and exit included). Ray's ``init`` (its
GCS, raylet and workers) is part of its start, as a user pays it. Monarch and Ray come from
the ``bench`` extra (``pip install -e '.[bench]'``); a missing one is skipped and said so. One
untimed round goes first, and ``PYTHONDONTWRITEBYTECODE`` is dropped from the children's
environment: every framework then runs from cached bytecode and warm files, as an installed one
does (without its cache, rlmesh compiled its own modules on every start: ~40 ms here).

Protocol, ``recipe``: ``rlmesh run recipe=ppo_cartpole eval.target=475`` as a subprocess
(``benchmarks/cartpole_vs_sb3.py``'s runner) vs a subprocess that imports SB3 and trains
rl-zoo's tuned PPO until the same greedy evaluation (20 episodes every 2048 env steps) reaches
475; both timed by the parent from process start to exit.

``floor`` is the least any framework can do: 4 plain ``python -c`` processes that import pyzmq and
answer one message each over a DEALER to this child's ROUTER (no framework at all). Rounds rotate
the order of the frameworks; each ratio is per round (rlmesh's time over the other's in the same
round), median and p90. Target (issue 40): rlmesh <= 0.5x Monarch, quiet and loaded.

``rlmesh-popen`` is rlmesh with ``RLMESH_FORKSERVER=0``: every proc a fresh interpreter, as
before the start-up template (the before/after of issue 16 in one run).

Run: ``python benchmarks/startup.py --runs 5`` (``--only spawn`` or ``--only recipe``).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, add_common_args, banner, have  # noqa: E402

FRAMEWORKS = ("rlmesh", "rlmesh-popen", "monarch", "ray", "floor")
PACKAGES = {"monarch": "monarch", "ray": "ray"}
N = 4


def spawn_rlmesh() -> dict:
    t0 = time.perf_counter()
    import rlmesh as rm

    class Echo(rm.Actor):
        @rm.endpoint
        async def ping(self, x: int = 0) -> int:
            return x

    procs = rm.this_host().spawn_procs(per_host={"procs": N})
    t1 = time.perf_counter()
    echo = procs.spawn("echo", Echo)
    assert len(echo.ping.call(1).get().values()) == N
    t2 = time.perf_counter()
    procs.stop()
    return {"procs_s": t1 - t0, "first_call_s": t2 - t0, "teardown_s": time.perf_counter() - t2}


def spawn_rlmesh_popen() -> dict:
    """rlmesh as before the start-up template: every proc a fresh ``python -m rlmesh.worker``."""
    os.environ["RLMESH_FORKSERVER"] = "0"
    return spawn_rlmesh()


def spawn_floor() -> dict:
    """4 plain Python processes started, each answering one zmq message: no framework at all."""
    t0 = time.perf_counter()
    import zmq

    router = zmq.Context.instance().socket(zmq.ROUTER)
    port = router.bind_to_random_port("tcp://127.0.0.1")
    code = ("import sys, zmq; s = zmq.Context().socket(zmq.DEALER); s.connect(sys.argv[1]); s.send(b'up'); "
            "s.recv(); s.send(b'bye')")
    kids = [subprocess.Popen([sys.executable, "-c", code, f"tcp://127.0.0.1:{port}"]) for _ in range(N)]
    t1 = time.perf_counter()
    idents = [router.recv_multipart()[0] for _ in range(N)]
    for ident in idents:
        router.send_multipart([ident, b"ping"])
    for _ in range(N):
        router.recv_multipart()
    t2 = time.perf_counter()
    for k in kids:
        k.wait()
    return {"procs_s": t1 - t0, "first_call_s": t2 - t0, "teardown_s": time.perf_counter() - t2}


def spawn_monarch() -> dict:
    t0 = time.perf_counter()
    from monarch.actor import Actor, endpoint, this_host

    class Echo(Actor):
        @endpoint
        async def ping(self, x: int = 0) -> int:
            return x

    procs = this_host().spawn_procs(per_host={"procs": N})
    t1 = time.perf_counter()
    echo = procs.spawn("echo", Echo)
    assert len(list(echo.ping.call(1).get().items())) == N
    t2 = time.perf_counter()
    procs.stop().get()
    return {"procs_s": t1 - t0, "first_call_s": t2 - t0, "teardown_s": time.perf_counter() - t2}


def spawn_ray() -> dict:
    t0 = time.perf_counter()
    import ray

    ray.init(num_cpus=N, include_dashboard=False, log_to_driver=False, configure_logging=False)

    @ray.remote
    class Echo:
        def ping(self, x: int = 0) -> int:
            return x

    t1 = time.perf_counter()
    actors = [Echo.remote() for _ in range(N)]
    assert len(ray.get([a.ping.remote(1) for a in actors])) == N
    t2 = time.perf_counter()
    ray.shutdown()
    return {"procs_s": t1 - t0, "first_call_s": t2 - t0, "teardown_s": time.perf_counter() - t2}


def sb3_whole(seed: int) -> dict:
    from cartpole_vs_sb3 import run_sb3  # deferred: imports torch, gymnasium and SB3 only in this subprocess

    import torch

    torch.set_num_threads(1)
    return run_sb3(seed, 2048, 100_000)


SPAWNS = {"rlmesh": spawn_rlmesh, "rlmesh-popen": spawn_rlmesh_popen, "monarch": spawn_monarch, "ray": spawn_ray,
          "floor": spawn_floor}


def child(args: list[str], timeout: float = 600) -> tuple[dict | None, float]:
    t = time.perf_counter()
    # PYTHONDONTWRITEBYTECODE: every framework runs from its cached bytecode, as an installed one does
    # (pip compiles a wheel's modules at install; an editable rlmesh writes its cache on first import)
    env = {k: v for k, v in os.environ.items() if k not in ("RLMESH_SECRET", "RLMESH_JOB_ID", "PYTHONDONTWRITEBYTECODE")}
    try:
        out = subprocess.run([sys.executable, os.path.abspath(__file__), *args], capture_output=True, text=True,
                             timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return None, time.perf_counter() - t
    wall = time.perf_counter() - t
    lines = [ln for ln in out.stdout.splitlines() if ln.startswith("{")]
    if out.returncode != 0 or not lines:
        sys.stderr.write(f"{' '.join(args)} failed:\n{out.stderr[-1500:]}\n")
        return None, wall
    return json.loads(lines[-1]), wall


def spread(xs: list[float]) -> str:
    if not xs:
        return "—"
    return f"{statistics.median(xs):6.2f}  ({min(xs):.2f}–{max(xs):.2f})"


def bench_spawn(runs: int, which: list[str], report: Report) -> None:
    for f in [f for f in which if f in PACKAGES and not have(PACKAGES[f])]:
        report.skipped(f, f"{f} is not installed (pip install -e '.[bench]')")
        which = [w for w in which if w != f]
    res: dict[str, dict[str, list[float]]] = {f: {"first_call_s": [], "teardown_s": [], "process_s": [],
                                                  "procs_s": []} for f in which}
    loads = []
    compile_rlmesh()
    for f in which:  # untimed: writes bytecode caches, and reads every framework's files into the page cache
        child(["--child", f])
    for i in range(runs):
        for f in which[i % len(which):] + which[: i % len(which)]:  # the order rotates run by run
            loads.append(os.getloadavg()[0])
            r, wall = child(["--child", f])
            if r is None:
                continue
            for k in ("first_call_s", "teardown_s", "procs_s"):
                res[f][k].append(r[k])
            res[f]["process_s"].append(wall)
            print(f"  run {i}: {f:12s} first call {r['first_call_s']:.2f} s  teardown {r['teardown_s']:.2f} s  "
                  f"process {wall:.2f} s  (load {loads[-1]:.1f})", flush=True)
    print(f"\nspawn_procs({N}) + spawn + first call, {runs} runs, median (min–max), load {min(loads):.1f}–"
          f"{max(loads):.1f}")
    print(f"{'framework':<14}{'first call s':>24}{'teardown s':>24}{'whole process s':>24}")
    for f in which:
        r = res[f]
        print(f"{f:<14}{spread(r['first_call_s']):>24}{spread(r['teardown_s']):>24}{spread(r['process_s']):>24}")
    for f in which:
        report.row(framework=f, **res[f])
    base = res.get("rlmesh", {}).get("first_call_s")
    for other in ("rlmesh-popen", "monarch", "ray", "floor"):
        o = res.get(other, {}).get("first_call_s")
        if base and o and len(o) == len(base):
            r = report.ratio(f"first_call_vs_{other}", [b / x for b, x in zip(base, o)], f"rlmesh s / {other} s")
            wp = report.ratio(f"whole_process_vs_{other}",
                              [b / x for b, x in zip(res["rlmesh"]["process_s"], res[other]["process_s"])],
                              f"rlmesh s / {other} s")
            if other == "monarch":
                report.target("start_up_vs_monarch", r.median, 0.5, note=f"load {min(loads):.1f}-{max(loads):.1f}")
                report.target("whole_process_vs_monarch", wp.median, 0.5)


def compile_rlmesh() -> None:
    """Write rlmesh's bytecode caches now (an editable checkout may have none yet), as pip does for a
    wheel at install: the timed runs then compare installed frameworks, not a compiler."""
    import compileall

    import rlmesh

    compileall.compile_dir(os.path.dirname(rlmesh.__file__), quiet=1)


def bench_recipe(seeds: list[int], report: Report) -> None:
    from cartpole_vs_sb3 import run_recipe  # deferred: imports torch and the recipes

    compile_rlmesh()
    rows = []
    for seed in seeds:
        load = os.getloadavg()[0]
        rec = run_recipe(seed, 2048, 100_000)
        sb3, sb3_wall = child(["--child-sb3", str(seed)])
        rows.append((rec["proc_s"], sb3_wall, rec["total_s"], sb3["total_s"] if sb3 else None))
        print(f"  seed {seed}: recipe process {rec['proc_s']:.1f} s (solved at {rec['total_s']:.1f} s of its loop, "
              f"{rec['steps']} steps)  SB3 process {sb3_wall:.1f} s (solved at "
              f"{sb3['total_s'] if sb3 else float('nan'):.1f} s, {sb3['steps'] if sb3 else '—'} steps)  "
              f"load {load:.1f}", flush=True)
    rec_w = [r[0] for r in rows]
    sb3_w = [r[1] for r in rows]
    print(f"\nwhole process to greedy return >= 475, seeds {seeds}, median (min–max)")
    print(f"  rlmesh ppo_cartpole {spread(rec_w)} s")
    print(f"  SB3 PPO             {spread(sb3_w)} s")
    print(f"  recipe / SB3 medians: {statistics.median(rec_w) / statistics.median(sb3_w):.2f}  (target <= 1)")
    report.row(recipe_process_s=rec_w, sb3_process_s=sb3_w)
    r = report.ratio("recipe_vs_sb3_whole_process", [a / b for a, b in zip(rec_w, sb3_w)], "rlmesh s / SB3 s")
    report.target("recipe_vs_sb3_whole_process", r.median, 1.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--frameworks", nargs="+", default=list(FRAMEWORKS), choices=FRAMEWORKS)
    ap.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    ap.add_argument("--only", choices=("spawn", "recipe"))
    ap.add_argument("--child", choices=FRAMEWORKS, help=argparse.SUPPRESS)
    ap.add_argument("--child-sb3", type=int, help=argparse.SUPPRESS)
    add_common_args(ap)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(SPAWNS[args.child]()), flush=True)
        return  # a normal exit: the parent's "whole process" includes it
    if args.child_sb3 is not None:
        print(json.dumps(sb3_whole(args.child_sb3)), flush=True)
        return
    banner("start-up: spawn_procs + first call, and a whole recipe process", "torch", "ray", "torchmonarch",
           "stable-baselines3")
    report = Report("startup", smoke=args.smoke, args=vars(args))
    if args.smoke:  # the floor only: Monarch's and Ray's runtimes take seconds each, the recipe trains to 475
        args.runs, args.only = 2, "spawn"
        for f in ("monarch", "ray"):
            if f in args.frameworks:
                report.skipped(f, "--smoke runs rlmesh against the plain-process floor only")
        args.frameworks = ["rlmesh", "floor"]
    if args.only in (None, "spawn"):
        bench_spawn(args.runs, args.frameworks, report)
    if args.only in (None, "recipe"):
        if have("stable_baselines3"):
            bench_recipe(args.seeds, report)
        else:
            report.skipped("sb3", "stable-baselines3 is not installed (pip install -e '.[bench]')")
    report.write(args.json)


if __name__ == "__main__":
    main()
