"""Real deaths among hundreds of real worker procs, on a loaded host: how long until the controller
declares a crashed, a stopped and a hung proc dead, and how many live procs it wrongly declares dead.

    python benchmarks/real_deaths.py --procs 200 --rounds 10 --load 8 [--sim 200]

``--procs`` real worker processes (``rm.this_host().spawn_procs``, restarts on, one small actor each)
are started on this host, while busy-loop processes hold the host's load near ``--load`` (a
regulator counts the runnable tasks every 0.1 s and starts or ends busy loops as other work comes and
goes; the load printed is the one seen). Each round then hits a random live proc three ways, the
order rotating round by round, with a call to it in flight each time:

- ``kill``: SIGKILL (a crash). Floor, in the same round: a SIGKILLed plain child process reaped by
  its parent (``Popen.wait``), the least time in which any supervisor can know of a crash.
- ``stop``: SIGSTOP (a frozen proc). Floor: ``RLMESH_HEARTBEAT_TIMEOUT_S``, the silence the
  supervisor waits for before it believes the OS's "stopped".
- ``hang``: the built-in fault injection's hang (the proc keeps running but its heartbeats stop and
  its loop stalls: stuck in a C call). Floor: the same timeout; the supervisor allows more silence
  where the heartbeat gaps seen on the host were longer (twice the longest of the last minute),
  which the line prints.

Each death is timed two ways, as a user sees it: to the supervisor's ``died`` event (what the
``actors`` telemetry row records) and to the in-flight call's future failing with ``rm.ActorDied``.
Every ``died`` event of a proc that was not hit is a false death, counted over the whole run (from
the first spawn to the stop). Each round also gathers a ``call()`` from every proc (all must answer).

``--sim N`` then repeats the kill and hang rounds on N simulated peers (benchmarks/_sim_peers.py,
what control_plane_scale.py measures above 8 procs) at the same target load, after the real procs
are stopped: sequential, not interleaved.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from collections import deque

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, add_common_args, banner, raw_kill, p90  # noqa: E402
from _sim_peers import SimLauncher  # noqa: E402

import rlmesh as rm  # noqa: E402
from rlmesh import settings  # noqa: E402
from rlmesh.actor import hooks  # noqa: E402
from rlmesh.actor.controller import Controller  # noqa: E402
from rlmesh.actor.proc_mesh import ProcMesh  # noqa: E402
from rlmesh.actor.supervision import GAP_MARGIN, GAP_WINDOW_S, TICK_S, FailureDetection  # noqa: E402

SMALL_PROC_BYTES = 16 << 20
"""Memory this script budgets per proc before it lifts admission's limit: twice the 8 MiB of PSS a
small proc (this one actor, forked from the start-up template) was measured to take."""


class Small(rm.Actor):
    @rm.endpoint
    async def ping(self) -> int:
        return os.getpid()

    @rm.endpoint
    async def hold(self, s: float) -> None:
        """The call in flight when the proc is hit: it never returns on its own."""
        await asyncio.sleep(s)


# ------------------------------------------------------------------------------------------ load
class LoadHolder:
    """Busy-loop processes that keep the host's runnable tasks near ``target``: every 2 s, the mean of
    the last 10 s of ``/proc/loadavg``'s runnable count, less the busy loops and the reader itself, is
    the rest of the host's demand; busy loops are started or ended to make up the difference (at most
    ``2 * target``). ``runnable`` keeps every sample, for the load seen."""

    def __init__(self, target: float) -> None:
        self.target = target
        self.hogs: list[subprocess.Popen] = []
        self.samples: deque[int] = deque(maxlen=100)
        self.counts: list[int] = []
        self.runnable: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="load-holder", daemon=True)

    def start(self) -> "LoadHolder":
        if self.target > 0:
            self._thread.start()
        return self

    def _run(self) -> None:
        n = 0
        while not self._stop.wait(0.1):
            self.samples.append(runnable())
            self.runnable.append(self.samples[-1])
            n += 1
            if n % 20 == 0:
                rest = statistics.mean(self.samples) - len(self.hogs)
                want = max(0, min(int(2 * self.target), round(self.target - rest)))
                while len(self.hogs) < want:
                    self.hogs.append(subprocess.Popen([sys.executable, "-c", "while True: pass"]))
                while len(self.hogs) > want:
                    self.hogs.pop().kill()
                self.counts.append(len(self.hogs))

    def close(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=5)
        for h in self.hogs:
            h.kill()
            h.wait()


def load1() -> float:
    return os.getloadavg()[0]


def settle(target: float, max_s: float) -> float:
    """Wait (at most ``max_s``) until the 1-minute load average is within 1 of ``target``; the wait."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < max_s and abs(load1() - target) > 1.0:
        time.sleep(1.0)
    return time.monotonic() - t0


# ---------------------------------------------------------------------------------------- deaths
class Deaths:
    """Every ``died`` event (monotonic time, event), an event sink."""

    def __init__(self) -> None:
        self.events: list[tuple[float, hooks.ProcEvent]] = []
        self.cv = threading.Condition()
        hooks.add_event_sink(self)

    def __call__(self, ev: hooks.ProcEvent) -> None:
        if ev.kind == "died":
            with self.cv:
                self.events.append((time.monotonic(), ev))
                self.cv.notify_all()

    def wait(self, proc_id: str, incarnation: int, timeout: float) -> tuple[float, hooks.ProcEvent] | None:
        end = time.monotonic() + timeout
        with self.cv:
            while True:
                hit = next((x for x in self.events if x[1].proc_id == proc_id and x[1].incarnation == incarnation), None)
                left = end - time.monotonic()
                if hit is not None or left <= 0:
                    return hit
                self.cv.wait(left)


ALLOWED = re.compile(r"beyond the ([\d.]+)s")


def hit(kind: str, procs: ProcMesh, mesh: rm.ActorMesh, rank: int, deaths: Deaths, sim: bool) -> dict:
    """Hit proc ``rank`` with ``kind`` while a call to it is in flight; time the ``died`` event and the
    failed future from the moment of the hit."""
    ctl = Controller.get()
    proc_id = procs.proc_ids[rank]
    rec = ctl.procs[proc_id]
    pending = None
    if not sim:  # a simulated peer answers every call at once: nothing stays in flight
        victim = mesh.slice(procs=rank)
        pending = victim.hold.call_one(3600)
        victim.ping.call_one().get(timeout=60)  # answered after the hold: the hold is in flight at the proc
    incarnation, pid, load = rec.incarnation, rec.pid, load1()
    t0 = time.monotonic()
    if kind == "kill":
        rec.handle.kill() if sim else os.kill(pid, signal.SIGKILL)
    elif kind == "stop":
        os.kill(pid, signal.SIGSTOP)
    elif sim:
        rec.handle.hang()
    else:
        ctl.inject_fault(proc_id, "hang")
    future_s, error = None, ""
    if pending is not None:
        try:
            pending.get(timeout=120)
            error = "the call returned"
        except rm.ActorDied:
            future_s = time.monotonic() - t0
        except Exception as exc:  # noqa: BLE001  # reported as a failed round, not raised
            error = f"{type(exc).__name__}: {exc}"
    got = deaths.wait(proc_id, incarnation, 60)
    peak = peak_runnable(1.0) if kind == "kill" else None  # every proc is told of the death, then of its replacement
    if kind == "stop" and pid is not None:
        try:
            os.kill(pid, signal.SIGKILL)  # the supervisor kills it; make sure, should it not have
        except ProcessLookupError:
            pass
    if got is None:
        return {"kind": kind, "rank": rank, "pid": pid, "error": error or "no died event within 60 s", "load": load}
    m = ALLOWED.search(got[1].reason)
    return {"kind": kind, "rank": rank, "pid": pid, "event_s": got[0] - t0, "future_s": future_s, "error": error,
            "load": load, "allowed_s": float(m.group(1)) if m else None, "reason": got[1].reason, "peak_runnable": peak}


def runnable() -> int:
    """Runnable tasks on the host now (``/proc/loadavg``), less this reader."""
    with open("/proc/loadavg") as f:
        return int(f.read().split()[3].split("/")[0]) - 1


def peak_runnable(seconds: float) -> int:
    """The most runnable tasks seen in ``seconds``, sampled every 5 ms: the burst of procs woken at once,
    which the load average (and with it the silence a hang is allowed) samples every 5 s."""
    end, peak = time.monotonic() + seconds, 0
    while time.monotonic() < end:
        peak = max(peak, runnable())
        time.sleep(0.005)
    return peak


def pss_mib(pids: list[int | None]) -> float:
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += next(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, StopIteration, TypeError):
            pass
    return total / 1024


def stats(xs: list[float]) -> str:
    if not xs:
        return "n/a"
    return (f"median {statistics.median(xs):.3f}  p90 {p90(xs):.3f}  max {max(xs):.3f} s "
            f"(min {min(xs):.3f}, n={len(xs)})")


def describe(res: dict) -> str:
    if "event_s" not in res:
        return f"FAILED: {res['error']}  load {res['load']:.1f}"
    fut = "-" if res["future_s"] is None else f"{res['future_s']:.3f} s"
    allowed = "" if res["allowed_s"] is None else f" (silence allowed {res['allowed_s']:.1f} s)"
    error = f" [{res['error']}]" if res["error"] else ""
    return f"died after {res['event_s']:.3f} s{allowed}, its call failed after {fut}{error}  load {res['load']:.1f}"


def beat_gaps(procs: ProcMesh) -> tuple[float, float]:
    """The largest gap between two heartbeats of any live proc, and the 99th percentile of all gaps, over
    the last ~minute the supervisor keeps (its failure detector's own history): what the silence allowed
    to a running proc must cover for no live proc to be declared dead."""
    ctl = Controller.get()
    ids = procs.proc_ids
    # read on the supervisor's thread, which appends to these histories
    gaps = sorted(ctl.submit(lambda: [x for p in ids for x in ctl.procs[p].hb.intervals]).result(timeout=60))
    return (gaps[-1], gaps[int(0.99 * (len(gaps) - 1))]) if gaps else (0.0, 0.0)


def run_rounds(label: str, kinds: tuple[str, ...], procs: ProcMesh, mesh: rm.ActorMesh, rounds: int,
               deaths: Deaths, rng: random.Random, sim: bool
               ) -> tuple[list[dict], list[float], list[float], list[tuple[float, float]]]:
    """``rounds`` rounds of one hit per kind (order rotating), a gather from every proc per round and,
    for real procs, the reaped-child floor (before or after the hits, alternating); per round, the
    heartbeat gaps of :func:`beat_gaps`."""
    out, gathers, raws, gaps = [], [], [], []
    n = len(procs.proc_ids)
    for r in range(rounds):
        if not sim and r % 2:
            raws.append(raw_kill())
        for kind in kinds[r % len(kinds):] + kinds[:r % len(kinds)]:
            procs.wait_alive(120)
            time.sleep(0.5)  # a few heartbeats from the last replacement
            res = hit(kind, procs, mesh, rng.randrange(n), deaths, sim)
            out.append(res)
            print(f"  {label} round {r} {kind:>4}: {describe(res)}", flush=True)
        if not sim and r % 2 == 0:
            raws.append(raw_kill())
        procs.wait_alive(120)
        t = time.monotonic()
        vals = mesh.ping.call().get(timeout=120)
        gathers.append(time.monotonic() - t)
        assert len(vals) == n, f"{len(vals)} of {n} procs answered"
        gaps.append(beat_gaps(procs))
    return out, gathers, raws, gaps


def lift_admission(n: int) -> None:
    """Admission (rlmesh/launch/admission.py) budgets 256 MiB a proc, a recipe proc's size; these procs
    are small. Lift its limit to ``n`` when the memory available holds ``n`` small procs with room,
    else stop here with what is missing (``RLMESH_MAX_PROCS`` set by the caller is kept)."""
    if settings.MAX_PROCS.is_set():
        return
    with open("/proc/meminfo") as f:
        avail = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    need = n * SMALL_PROC_BYTES + (2 << 30)
    if avail < need:
        sys.exit(f"{n} small procs need {need / (1 << 30):.1f} GiB with room, {avail / (1 << 30):.1f} GiB is "
                 f"available: lower --procs")
    os.environ[settings.MAX_PROCS.name] = str(n)


def summarize(label: str, results: list[dict], report: Report, floors: dict[str, list[float]]) -> dict:
    summary = {}
    for kind in ("kill", "stop", "hang"):
        rs = [r for r in results if r["kind"] == kind]
        if not rs:
            continue
        ev = [r["event_s"] for r in rs if "event_s" in r]
        fut = [r["future_s"] for r in rs if r.get("future_s") is not None]
        failed = [r for r in rs if "event_s" not in r or r.get("error")]
        print(f"{label} {kind:>4} -> died:          {stats(ev)}")
        if fut:
            print(f"{label} {kind:>4} -> call failed:   {stats(fut)}")
        peaks = [r["peak_runnable"] for r in rs if r.get("peak_runnable") is not None]
        if peaks:
            print(f"{label} {kind:>4}    runnable tasks at the peak of the next second: median "
                  f"{statistics.median(peaks):.0f}, max {max(peaks)} (every proc is told of the death and the restart)")
        allowed = [r["allowed_s"] for r in rs if r.get("allowed_s") is not None]
        if allowed:
            print(f"{label} {kind:>4}    silence allowed: {min(allowed):.1f}-{max(allowed):.1f} s")
        if failed:
            print(f"{label} {kind:>4}    {len(failed)} of {len(rs)} hits not seen as ActorDied: "
                  + "; ".join(r["error"] for r in failed[:3]))
        summary[kind] = {"event_s": ev, "future_s": fut, "allowed_s": allowed, "failed": len(failed), "peak_runnable": peaks,
                         "load": [r["load"] for r in rs]}
        floor = floors.get(kind)
        if floor and ev:
            if kind == "kill":  # per round: the reaped child of the same round
                pairs = list(zip(ev, floor))
                report.ratio(f"{label}_kill_vs_reaped_child", [e / w for e, w in pairs], "died s / waitpid s, same round")
            else:
                report.ratio(f"{label}_{kind}_vs_heartbeat_timeout", [e / floor[0] for e in ev],
                             f"died s / the {floor[0]:g} s heartbeat timeout")
    return summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--procs", type=int, default=200, help="real worker procs")
    ap.add_argument("--rounds", type=int, default=8, help="rounds of one kill, one stop and one hang each")
    ap.add_argument("--load", type=float, default=8.0, help="runnable tasks to hold the host at (0: leave it be)")
    ap.add_argument("--settle-s", type=float, default=90.0, help="at most this long for the 1-minute load to get there")
    ap.add_argument("--sim", type=int, default=0, help="then the kill and hang rounds on this many simulated peers")
    ap.add_argument("--kinds", default="kill,stop,hang")
    ap.add_argument("--seed", type=int, default=0)
    add_common_args(ap)
    args = ap.parse_args()
    if args.smoke:
        args.procs, args.rounds, args.load, args.settle_s, args.sim, args.kinds = 8, 1, 0.0, 0.0, 0, "kill,stop"
    kinds = tuple(args.kinds.split(","))
    banner(f"real deaths among {args.procs} real worker procs at load {args.load:g}")
    report = Report("real_deaths", smoke=args.smoke, args=vars(args))
    detect = FailureDetection.from_env()
    hb_timeout = detect.heartbeat_timeout_s
    print(f"# failure detection in force: heartbeat_timeout_s {hb_timeout:g} (floor; at least {GAP_MARGIN:g}x the "
          f"longest heartbeat gap of the host's last {GAP_WINDOW_S:g} s, on a running silent proc), "
          f"heartbeat_phi {detect.heartbeat_phi:g}, "
          f"init_heartbeat_timeout_s {detect.init_heartbeat_timeout_s:g}, supervisor tick {TICK_S:g} s, "
          f"{'board' if not settings.HB_BOARD_OFF.get() else 'message'} heartbeats")
    lift_admission(args.procs)
    deaths = Deaths()
    holder = LoadHolder(args.load).start()
    rng = random.Random(args.seed)
    summary: dict = {}
    try:
        t0 = time.monotonic()
        procs = rm.this_host().spawn_procs(per_host={"procs": args.procs}, restart=rm.Restart(max_restarts=-1),
                                           name="real")
        mesh = procs.spawn("small", Small)
        up_s = time.monotonic() - t0
        mesh.ping.call().get(timeout=120)  # every data connection up
        ctl = Controller.get()
        pss = pss_mib(procs.pids)
        print(f"# {args.procs} procs up in {up_s:.1f} s; PSS {pss:.0f} MiB in all ({pss / args.procs:.1f} MiB a proc), "
              f"controller fds {len(os.listdir('/proc/self/fd'))}; heartbeat every {ctl._hb_s:g} s", flush=True)
        if args.load > 0:
            waited = settle(args.load, args.settle_s)
            print(f"# load: 1-minute average {load1():.1f} after {waited:.0f} s, {len(holder.hogs)} busy loops "
                  f"(target {args.load:g})", flush=True)
        mark = len(holder.runnable)
        results, gathers, raws, gaps = run_rounds("real", kinds, procs, mesh, args.rounds, deaths, rng, sim=False)
        runnable = holder.runnable[mark:]
        victims = {r["pid"] for r in results}  # a hit whose death came late is not a false death
        procs.stop()
        false = [e for _, e in deaths.events if e.proc_mesh == "real" and e.pid not in victims]
        loads = [r["load"] for r in results]
        print(f"# real: {args.procs} procs, load (1-minute, at each hit) median {statistics.median(loads):.1f} "
              f"range {min(loads):.1f}-{max(loads):.1f}; "
              + (f"runnable tasks (0.1 s samples) mean {statistics.mean(runnable):.1f}; " if runnable else "")
              + f"busy loops {min(holder.counts, default=0)}-"
              f"{max(holder.counts, default=0)}; gather from all {stats(gathers)}")
        summary["real"] = summarize("real", results, report, {"kill": raws, "stop": [hb_timeout], "hang": [hb_timeout]})
        print(f"real kill -> a plain child reaped (floor): {stats(raws)}")
        print(f"real heartbeat gaps of the {args.procs} live procs: largest {max(g for g, _ in gaps):.3f} s, "
              f"99th percentile {max(q for _, q in gaps):.3f} s (the worst round); a hang is allowed "
              f"{stats(summary['real'].get('hang', {}).get('allowed_s', []))}")
        print(f"false deaths: {len(false)} (died events of procs not hit, spawn to stop)"
              + "".join(f"\n  {e.proc_id} pid {e.pid}: {e.reason}" for e in false[:5]))
        report.target("real_false_deaths", len(false), 0, unit=" deaths")
        report.row(kind="real", procs=args.procs, up_s=up_s, pss_mib=pss, gather_s=gathers, raw_kill_s=raws,
                   false_deaths=len(false), loads=loads, beat_gaps=gaps, runnable_mean=statistics.mean(runnable) if runnable else None,
                   hits=results)
        if args.sim:
            sim = SimLauncher(max(1, args.sim // 100))
            try:
                speers = ProcMesh.launch("sim", {"procs": args.sim}, sim, restart=rm.Restart(max_restarts=-1),
                                         timeout=120)
                smesh = speers.spawn("small_sim", Small)
                sim_kinds = tuple(k for k in kinds if k != "stop")  # a simulated peer is a thread: nothing to SIGSTOP
                if args.load > 0:
                    waited = settle(args.load, args.settle_s)
                    print(f"# sim: load {load1():.1f} after {waited:.0f} s, {len(holder.hogs)} busy loops", flush=True)
                sres, sgath, _, _ = run_rounds("sim", sim_kinds, speers, smesh, args.rounds, deaths, rng, sim=True)
                speers.stop()
            finally:
                sim.close()
            sloads = [r["load"] for r in sres]
            print(f"# sim: {args.sim} simulated peers, load median {statistics.median(sloads):.1f} "
                  f"range {min(sloads):.1f}-{max(sloads):.1f}; gather from all {stats(sgath)}")
            summary["sim"] = summarize("sim", sres, report, {"hang": [hb_timeout]})
            report.row(kind="sim", procs=args.sim, gather_s=sgath, loads=sloads, hits=sres)
            for kind in sim_kinds:
                real_ev, sim_ev = summary["real"].get(kind, {}).get("event_s"), summary["sim"].get(kind, {}).get("event_s")
                if real_ev and sim_ev:
                    print(f"real / simulated, {kind} -> died, medians: "
                          f"{statistics.median(real_ev) / statistics.median(sim_ev):.2f}x (sequential, same target load)")
    finally:
        holder.close()
        Controller.get().shutdown()
    print(f"# load at end: {load1():.1f} on {os.cpu_count()} CPUs")
    report.write(args.json, {"summary": summary})


if __name__ == "__main__":
    main()
