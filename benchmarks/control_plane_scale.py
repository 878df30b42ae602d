"""How the controller's control plane grows with the number of procs N (issue 16, item 5).

    python benchmarks/control_plane_scale.py [--sizes 8,64,256,1000] [--real-max 8] [--hosts 4]
                                             [--idle-s 5] [--rounds 5]

Per N it prints:
  - idle controller CPU (% of one core, whole controller process, and its supervisor thread
    alone) while the procs only heartbeat;
  - ``broadcast`` to all (time to hand every message to zmq) and a ``call()`` gathered from all
    (a ValueMesh of N replies), median and max over ``--rounds``;
  - time from a proc's death to the supervisor's ``died`` event (an exit its launcher sees:
    SIGKILL of a real proc, the host's exit report for a simulated one), one death at a time,
    and for one death that comes right after another's event (while the supervisor still tells
    the N others of the first); for simulated peers, a hang (heartbeats stop, nothing exits).
Telemetry rows/s with N writers is measured by benchmarks/telemetry_writers.py.

Up to ``--real-max`` procs are real worker processes (``spawn_procs``); above it they are
simulated peers (benchmarks/_sim_peers.py): ``--hosts`` processes that each run N/hosts peers
speaking the real protocol on the real authenticated transport (own control socket, heartbeats,
own data-plane socket per peer), without running actor code. Targets (issue 16): idle CPU < 5 %
of a core at 1,000 procs; death among 1,000 detected as fast as among 8; gather at 1,000 < 0.5 s.
"""

from __future__ import annotations

import argparse
import os
import resource
import signal
import statistics
import sys
import threading
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import rlmesh as rm  # noqa: E402
from rlmesh.actor import hooks  # noqa: E402
from rlmesh.actor.controller import Controller  # noqa: E402
from rlmesh.actor.proc_mesh import ProcMesh  # noqa: E402

from _common import Report, add_common_args, banner  # noqa: E402
from _sim_peers import SimLauncher  # noqa: E402


class Echo(rm.Actor):
    @rm.endpoint
    async def echo(self, x: int) -> int:
        return x


def _thread_cpu(native_id: int) -> float:
    """CPU seconds of one thread of this process (utime + stime from /proc)."""
    with open(f"/proc/self/task/{native_id}/stat") as f:
        parts = f.read().rsplit(")", 1)[1].split()
    return (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")


def _threads_cpu() -> dict[str, float]:
    """CPU seconds per thread name (``comm``, as the kernel sees it: zmq's I/O threads are ``ZMQbg/...``)."""
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/stat") as f:
                raw = f.read()
        except OSError:
            continue
        name = raw[raw.index("(") + 1:raw.rindex(")")]
        parts = raw.rsplit(")", 1)[1].split()
        out[name] = out.get(name, 0.0) + (int(parts[11]) + int(parts[12])) / os.sysconf("SC_CLK_TCK")
    return out


def _proc_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime


def spread(xs: list[float], unit: str = "s") -> str:
    if not xs:
        return "n/a"
    return f"{statistics.median(xs):.3f} (min {min(xs):.3f} max {max(xs):.3f}) {unit}"


class Deaths:
    """Monotonic time of each ``died`` event, by proc id (an event sink)."""

    def __init__(self) -> None:
        self.at: dict[str, float] = {}
        self.cv = threading.Condition()
        hooks.add_event_sink(self)

    def __call__(self, ev: hooks.ProcEvent) -> None:
        if ev.kind == "died":
            with self.cv:
                self.at[ev.proc_id] = time.monotonic()
                self.cv.notify_all()

    def wait(self, proc_id: str, timeout: float) -> float | None:
        end = time.monotonic() + timeout
        with self.cv:
            while proc_id not in self.at:
                left = end - time.monotonic()
                if left <= 0:
                    return None
                self.cv.wait(left)
            return self.at[proc_id]


def measure(n: int, args: argparse.Namespace, deaths: Deaths, sim: SimLauncher | None) -> dict:
    ctl = Controller.get()
    beats = "board" if sim is None or sim.same_host else "message"
    name = f"scale{n}-{beats}"
    t0 = time.monotonic()
    if sim is None:
        procs = rm.this_host().spawn_procs(per_host={"procs": n}, name=name)
    else:
        procs = ProcMesh.launch(name, {"procs": n}, sim, timeout=120)
    mesh = procs.spawn("echo", Echo)
    started = time.monotonic() - t0
    mesh.echo.call(0).get(timeout=120)  # connections up

    # idle: only heartbeats (let the joins settle first)
    time.sleep(1.0)
    sup = ctl._thread.native_id
    c0, s0, w0, t0s = _proc_cpu(), _thread_cpu(sup), time.monotonic(), _threads_cpu()
    time.sleep(args.idle_s)
    c1, s1, w1, t1s = _proc_cpu(), _thread_cpu(sup), time.monotonic(), _threads_cpu()
    by_thread = {k: round(100 * (v - t0s.get(k, 0.0)) / (w1 - w0), 1) for k, v in t1s.items() if v > t0s.get(k, 0.0)}
    idle_cpu, sup_cpu = 100 * (c1 - c0) / (w1 - w0), 100 * (s1 - s0) / (w1 - w0)

    bcast, gather, gather_cpu = [], [], []
    for i in range(args.rounds):
        t = time.perf_counter()
        mesh.echo.broadcast(i)
        bcast.append(time.perf_counter() - t)
        time.sleep(0.2)  # let the broadcast's replies-free traffic settle
        t, c = time.perf_counter(), _proc_cpu()
        vals = mesh.echo.call(i).get(timeout=120)
        gather.append(time.perf_counter() - t)
        gather_cpu.append(_proc_cpu() - c)
        assert list(vals.values()) == [i] * n, "a reply is missing or wrong"

    # ``--deaths`` deaths one at a time (the supervisor done with the previous one, its PROC_DOWN sent to
    # every proc: a death among N), then one more right after the last one's event (a death that
    # arrives while the supervisor still tells the N others of the previous one).
    kills, noticed, after_another, after_notice = [], [], [], []
    victims = [procs._proc_ids[r] for r in range(min(args.deaths + 1, n - 1), 0, -1)]
    for i, pid_ in enumerate(victims):
        right_after = i > 0 and i == len(victims) - 1
        if not right_after:
            ctl.submit(lambda: None).result(timeout=60)  # runs once the supervisor finished its current work
        rec = ctl.procs[pid_]
        t = time.monotonic()
        if sim is None:
            os.kill(rec.pid, signal.SIGKILL)
        else:
            rec.handle.kill()
        at = deaths.wait(pid_, 60)
        if at is not None:
            (after_another if right_after else kills).append(at - t)
            if getattr(rec.handle, "exited_at", None) is not None:  # launcher's notice -> event
                (after_notice if right_after else noticed).append(at - rec.handle.exited_at)
    hang = None
    if sim is not None and n > args.deaths + 1 and not args.smoke:  # a hang waits out the heartbeat timeout
        pid_ = procs._proc_ids[n - 1]
        t = time.monotonic()
        ctl.procs[pid_].handle.hang()
        at = deaths.wait(pid_, 60)
        hang = None if at is None else at - t
    load = os.getloadavg()[0]
    t = time.perf_counter()
    procs.stop()
    stop_s = time.perf_counter() - t
    return {"n": n, "kind": "real" if sim is None else "sim", "beats": beats, "start_s": started, "idle_cpu_pct": idle_cpu,
            "supervisor_cpu_pct": sup_cpu, "broadcast_s": bcast, "gather_s": gather, "gather_cpu_s": gather_cpu,
            "death_s": kills, "death_after_notice_s": noticed, "death_right_after_another_s": after_another,
            "death_right_after_another_after_notice_s": after_notice,
            "hang_s": hang, "stop_s": stop_s, "load": load, "idle_cpu_by_thread_pct": by_thread}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="8,64,256,1000")
    ap.add_argument("--real-max", type=int, default=8, help="largest N run as real worker processes")
    ap.add_argument("--hosts", type=int, default=4, help="processes hosting simulated peers / telemetry writers")
    ap.add_argument("--idle-s", type=float, default=5.0)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--deaths", type=int, default=3)
    ap.add_argument("--beats", choices=["board", "message", "both"], default="both",
                    help="simulated peers beat through the controller's shared-memory board (procs on its host), "
                         "by message (pods, other hosts), or each N both ways")
    add_common_args(ap)
    args = ap.parse_args()
    if args.smoke:
        args.sizes, args.real_max, args.hosts, args.idle_s, args.rounds, args.deaths, args.beats = \
            "4,64", 4, 2, 0.5, 2, 1, "board"
    report = Report("control_plane_scale", smoke=args.smoke, args=vars(args))
    banner("control plane scale (issue 16 item 5)")
    print(f"# load at start: {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores; heartbeat every "
          f"{os.environ.get('RLMESH_HEARTBEAT_S', '0.2')} s")
    sizes = [int(s) for s in args.sizes.split(",")]
    deaths = Deaths()
    Controller.get()  # the job secret exists from here on: simulated hosts inherit it
    sims = {mode: SimLauncher(args.hosts, same_host=mode == "board") for mode in ("board", "message")
            if args.beats in (mode, "both")} if any(n > args.real_max for n in sizes) else {}
    runs = [(n, None) for n in sizes if n <= args.real_max] + [(n, sim) for n in sizes if n > args.real_max
                                                             for sim in sims.values()]
    results = []
    try:
        print(f"{'N':>5} {'kind':>4} {'beats':>7} {'start s':>8} {'idle CPU %':>10} {'superv %':>9} {'broadcast s':>12} "
              f"{'gather s (med/max)':>19} {'death s (med/max)':>18} {'hang s':>7} {'load':>5}")
        for n, sim in runs:
            r = measure(n, args, deaths, sim)
            results.append(r)
            d = r["death_s"]
            print(f"{n:>5} {r['kind']:>4} {r['beats']:>7} {r['start_s']:>8.2f} {r['idle_cpu_pct']:>10.1f} "
                  f"{r['supervisor_cpu_pct']:>9.1f} {statistics.median(r['broadcast_s']):>12.4f} "
                  f"{statistics.median(r['gather_s']):>9.4f}/{max(r['gather_s']):<9.4f} "
                  f"{(statistics.median(d) if d else float('nan')):>8.3f}/{(max(d) if d else float('nan')):<9.3f} "
                  f"{(r['hang_s'] if r['hang_s'] is not None else float('nan')):>7.2f} {r['load']:>5.1f}", flush=True)
            print(f"      stop of all N procs {r['stop_s']:.2f} s; idle CPU by thread (%): {r['idle_cpu_by_thread_pct']}; gather CPU "
                  f"{statistics.median(r['gather_cpu_s']):.3f} s; death after the launcher's notice "
                  f"{spread(r['death_after_notice_s'])}; a death right after another "
                  f"{spread(r['death_right_after_another_s'])}"
                  + (f" (after the launcher's notice {spread(r['death_right_after_another_after_notice_s'])})"
                     if r["death_right_after_another_after_notice_s"] else ""))
            report.row(**r)
            label = f"{n}_{r['kind']}_{r['beats']}"
            report.target(f"idle_cpu_{label}", r["idle_cpu_pct"], 5.0, unit="%")
            report.target(f"gather_{label}", statistics.median(r["gather_s"]), 0.5, unit="s")
            base = results[0]
            if r is not base and r["death_s"] and base["death_s"]:  # the floor: a death among the fewest procs
                dr = report.ratio(f"death_{label}_vs_{base['n']}_{base['kind']}",
                                  [d / statistics.median(base["death_s"]) for d in r["death_s"]],
                                  f"kill -> died s / the median among {base['n']} (not interleaved)")
                report.target(f"death_{label}_as_fast_as_among_{base['n']}", dr.median, 1.5)
    finally:
        Controller.get().shutdown()
        for sim in sims.values():
            sim.close()
    report.write(args.json)


if __name__ == "__main__":
    main()
