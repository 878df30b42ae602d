"""``rlmesh dashboard [RUN]``: serve the dashboard (uvicorn) and print its URL with the token.

    rlmesh dashboard                      # every run under ./runs, opened at the latest one
    rlmesh dashboard 20261203-101500-a1b2 --port 8300
    rlmesh dashboard --host 0.0.0.0 --certfile cert.pem --keyfile key.pem   # off loopback: TLS required

The URL carries a random token (``--token`` or ``RLMESH_DASHBOARD_TOKEN`` to choose one);
requests without it get 403. While serving, ``runs/<run>/dashboard.json`` (mode 0600) holds
the URL, so a recipe started with ``telemetry.dashboard=true`` can print it.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import Any

from rlmesh import settings
from rlmesh.dashboard.auth import DASHBOARD_JSON, TOKEN_ENV, DashboardSecurityError, ServeSecurity, new_token
from rlmesh.dashboard.data import RunDirectory
from rlmesh.telemetry import limits
from rlmesh.telemetry.errors import RunNotFoundError
from rlmesh.telemetry.run import pid_alive, write_json

logger = logging.getLogger(__name__)

DEFAULT_PORT = 8299  # not 8265: Ray's dashboard, often on the same hosts


def _bind(host: str, port: int) -> socket.socket:
    """Bind first (port 0 picks a free one), then hand the socket to uvicorn: the URL is known before serving."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port} ({exc}); choose another --port (0 picks a free one)") from exc
    sock.listen(128)
    sock.set_inheritable(True)
    return sock


def _watch_parent(pid: int, server: object) -> None:
    """Stop serving when the run's controller exits (a dashboard started by a recipe must not outlive it)."""
    while pid_alive(pid):
        time.sleep(0.5)
    server.should_exit = True  # type: ignore[attr-defined]
    limits.cancel_all("the dashboard is stopping (its run ended)")


def dashboard_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="rlmesh dashboard", description="live web pages over the runs' telemetry",
                                epilog="docs/dashboard.md", formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("run", nargs="?", default=None, help="run id or 'latest' to open first (default: the runs list)")
    p.add_argument("--host", default="127.0.0.1", help="listen address (default loopback; others need TLS)")
    p.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0 = a free one)")
    p.add_argument("--token", default=None, help=f"access token (default ${TOKEN_ENV}, else a random one)")
    p.add_argument("--certfile", help="TLS certificate (PEM); required off loopback")
    p.add_argument("--keyfile", help="TLS private key (PEM)")
    p.add_argument("--refresh-s", type=float, default=2.0, help="seconds between live updates of a page")
    p.add_argument("--runs-dir", default=None, help="runs directory (default $RLMESH_RUNS_DIR or ./runs)")
    p.add_argument("--exit-with-pid", type=int, default=None, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    try:
        import uvicorn  # deferred: optional extra rlmesh[dashboard]

        from rlmesh.dashboard.app import create_app  # deferred: imports starlette, the optional rlmesh[dashboard] extra
    except ImportError as exc:
        print(f"rlmesh dashboard needs the dashboard extra: pip install 'rlmesh[dashboard]' ({exc})", file=sys.stderr)
        return 2
    sec = ServeSecurity(a.host, a.token or settings.DASHBOARD_TOKEN.get() or new_token(), a.certfile, a.keyfile)
    try:
        sec.check()
        if a.refresh_s <= 0:
            raise DashboardSecurityError(f"--refresh-s={a.refresh_s}: use a positive number of seconds")
    except DashboardSecurityError as exc:
        print(f"rlmesh dashboard: {exc}", file=sys.stderr)
        return 2
    rd = RunDirectory(Path(a.runs_dir) if a.runs_dir else None)
    run_dir = None
    if a.run:
        try:
            run_dir = rd.resolve(a.run)
        except RunNotFoundError as exc:
            print(f"rlmesh dashboard: {exc}", file=sys.stderr)
            return 1
    try:
        sock = _bind(a.host, a.port)
    except OSError as exc:
        print(f"rlmesh dashboard: {exc}", file=sys.stderr)
        return 1
    port = sock.getsockname()[1]
    app = create_app(rd, sec.token, refresh_s=a.refresh_s, cookie_name=f"rlmesh-dashboard-{port}",
                     secure_cookie=sec.tls, default_run=run_dir.name if run_dir else None)
    shown_host = a.host if ":" not in a.host else f"[{a.host}]"
    path = f"/run/{run_dir.name}" if run_dir else "/"
    url = f"{'https' if sec.tls else 'http'}://{shown_host}:{port}{path}?token={sec.token}"
    if run_dir is not None:
        write_json(run_dir / DASHBOARD_JSON, {"url": url, "pid": os.getpid(), "port": port}, private=True)
    print(f"rlmesh dashboard: {url}", flush=True)
    config = uvicorn.Config(app, log_level="warning", ssl_certfile=a.certfile, ssl_keyfile=a.keyfile,
                            access_log=False, lifespan="off", timeout_graceful_shutdown=5)

    class Server(uvicorn.Server):
        def handle_exit(self, sig: int, frame: Any) -> None:  # SIGTERM, Ctrl-C: queries in flight stop now
            limits.cancel_all("the dashboard is stopping")
            super().handle_exit(sig, frame)

    server = Server(config)
    if a.exit_with_pid:
        threading.Thread(target=_watch_parent, args=(a.exit_with_pid, server), daemon=True).start()
    def _exit_on_term(signum: int, frame: object) -> None:
        raise SystemExit(0)  # uvicorn re-raises SIGTERM after its graceful stop: end here, cleanup below

    signal.signal(signal.SIGTERM, _exit_on_term)
    try:
        server.run(sockets=[sock])
    except KeyboardInterrupt:  # Ctrl+C (also a run's, which reaches its dashboard): uvicorn has already
        pass  # stopped gracefully and re-raises it; stop quietly, no traceback
    finally:
        sock.close()
        if run_dir is not None:
            (run_dir / DASHBOARD_JSON).unlink(missing_ok=True)
    return 0


if __name__ == "__main__":
    sys.exit(dashboard_main(sys.argv[1:]))
