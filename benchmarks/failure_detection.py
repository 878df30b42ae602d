"""How fast the supervisor declares a SIGKILLed and a SIGSTOPped proc dead, and how many live
procs it wrongly declares dead while the host is saturated.

    python benchmarks/failure_detection.py --rounds 5 [--hog 8] [--busy-s 20]

Each round SIGKILLs rank 1 of a 3-proc mesh (restarts on), then SIGSTOPs it, and times kill ->
``died`` event. With ``--busy-s``, the mesh's procs first run busy Python endpoints for that long
while ``--hog`` busy-loop processes saturate the CPUs, and every ``died`` event in that time is a
false death. Prints the spread (min / median / max) and the load average. Uses only the public
API and the event hooks, so the same script measures an older tree (``PYTHONPATH=...``).

Floors, per round, the order alternating: a SIGKILLed plain child process reaped by its parent
(``Popen.wait``: the least time in which any supervisor can know of a crash); for SIGSTOP, the
heartbeat timeout itself (``RLMESH_HEARTBEAT_TIMEOUT_S``): no signal tells of a hang, so nothing can
find one sooner than the silence it waits for.
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, add_common_args, banner, raw_kill  # noqa: E402

import rlmesh as rm  # noqa: E402
from rlmesh import settings  # noqa: E402
from rlmesh.actor import hooks  # noqa: E402


class Spinner(rm.Actor):
    @rm.endpoint
    def spin(self, s: float) -> int:
        end, n = time.monotonic() + s, 0
        while time.monotonic() < end:
            n += 1
        return n


def spread(xs: list[float]) -> str:
    return "n/a" if not xs else f"min {min(xs):.3f}  median {statistics.median(xs):.3f}  max {max(xs):.3f} s (n={len(xs)})"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--hog", type=int, default=0, help="busy-loop processes to start (CPU saturation)")
    ap.add_argument("--busy-s", type=float, default=0.0, help="seconds of busy endpoints to count false deaths in")
    ap.add_argument("--stops", type=int, default=None, help="SIGSTOP rounds (default: --rounds)")
    add_common_args(ap)
    args = ap.parse_args()
    if args.smoke:
        args.rounds, args.stops, args.hog, args.busy_s = 2, 1, 0, 0.0
    stops = args.rounds if args.stops is None else args.stops
    banner("failure detection: SIGKILL and SIGSTOP to died")
    report = Report("failure_detection", smoke=args.smoke, args=vars(args))
    events: list[tuple[float, hooks.ProcEvent]] = []
    hooks.add_event_sink(lambda e: events.append((time.monotonic(), e)))
    hogs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.hog)]
    try:
        procs = rm.this_host().spawn_procs(per_host={"procs": 3}, restart=rm.Restart(max_restarts=-1), name="fd")
        spinners = procs.spawn("spin", Spinner)
        false_deaths = 0
        if args.busy_s:
            n0 = len(events)
            end = time.monotonic() + args.busy_s
            while time.monotonic() < end:
                try:
                    spinners.spin.call(0.5).get(timeout=120)
                except rm.ActorError:
                    procs.wait_alive(120)
            false_deaths = sum(1 for _, e in events[n0:] if e.kind == "died")
            print(f"false deaths in {args.busy_s:.0f}s of busy endpoints with {args.hog} hogs: {false_deaths} "
                  f"(load {os.getloadavg()[0]:.1f})", flush=True)
        kill_s, stop_s, raw_s = [], [], []
        for r in range(args.rounds):
            if r % 2:
                raw_s.append(raw_kill())
            for sig, out in ((signal.SIGKILL, kill_s), (signal.SIGSTOP, stop_s))[: 2 if r < stops else 1]:
                procs.wait_alive(120)
                time.sleep(0.5)  # a few heartbeats from the replacement
                pid, n0 = procs.pids[1], len(events)
                t0 = time.monotonic()
                os.kill(pid, sig)
                while not any(e.kind == "died" and e.pid == pid for _, e in events[n0:]):
                    time.sleep(0.002)
                out.append(next(t for t, e in events[n0:] if e.kind == "died" and e.pid == pid) - t0)
                if sig == signal.SIGSTOP:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
            if r % 2 == 0:
                raw_s.append(raw_kill())
        print(f"SIGKILL -> died: {spread(kill_s)}")
        print(f"SIGKILL -> a plain child reaped (floor): {spread(raw_s)}")
        print(f"SIGSTOP -> died: {spread(stop_s)}")
        report.row(kill_s=kill_s, raw_kill_s=raw_s, stop_s=stop_s, false_deaths=false_deaths, hogs=args.hog)
        report.ratio("sigkill_vs_reaped_child", [k / w for k, w in zip(kill_s, raw_s)], "rlmesh s / waitpid s")
        hb = settings.HEARTBEAT_TIMEOUT_S.get()
        report.ratio("sigstop_vs_heartbeat_timeout", [x / hb for x in stop_s], f"rlmesh s / the {hb:g} s timeout")
        print(f"load average: {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
        procs.stop()
    finally:
        for h in hogs:
            h.kill()
    report.write(args.json)


if __name__ == "__main__":
    main()
