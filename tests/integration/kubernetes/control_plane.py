"""A real Kubernetes control plane on loopback for the launcher's tests: etcd, kube-apiserver
(token auth + RBAC), kube-controller-manager (service accounts, garbage collector) and
kube-scheduler, from the binaries ``scripts/k8s_build.sh`` caches.

Nothing here mocks the API: the launcher talks HTTPS to a genuine kube-apiserver. Only the
kubelet is played by :mod:`fake_kubelet`.
"""

from __future__ import annotations

import os
import shutil
import socket
import ssl
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path

BIN_ENV = "RLMESH_K8S_BIN"
ADMIN_TOKEN = "rlmesh-admin-token"
LIMITED_TOKEN = "rlmesh-limited-token"
LIMITED_USER = "rlmesh-limited"
BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler")


def bin_dir() -> Path:
    """``$RLMESH_K8S_BIN``, else ``bin/`` of the build cache (``$RLMESH_K8S_CACHE`` or ``~/.cache/rlmesh/k8s``)."""
    cache = Path(os.environ.get("RLMESH_K8S_CACHE") or Path.home() / ".cache/rlmesh/k8s")
    return Path(os.environ.get(BIN_ENV) or cache / "bin")


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if not os.access(bin_dir() / b, os.X_OK)]


def _die_with_parent() -> None:
    """In the child: SIGKILL when the test process dies, however it dies (no orphaned API servers)."""
    import ctypes
    import signal

    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def kubeconfig_text(server: str, token: str, user: str, ca: Path) -> str:
    return f"""apiVersion: v1
kind: Config
clusters:
- name: local
  cluster: {{server: "{server}", certificate-authority: "{ca}"}}
users:
- name: {user}
  user: {{token: "{token}"}}
contexts:
- name: {user}@local
  context: {{cluster: local, user: {user}}}
current-context: {user}@local
"""


class ControlPlane:
    """Start with :meth:`start`, stop with :meth:`stop`; ``admin_kubeconfig`` / ``limited_kubeconfig``."""

    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="rlmesh-k8s-"))
        self.procs: dict[str, subprocess.Popen] = {}
        self.port = _free_port()
        self.server = f"https://127.0.0.1:{self.port}"
        self.admin_kubeconfig = self.dir / "admin.kubeconfig"
        self.limited_kubeconfig = self.dir / "limited.kubeconfig"
        self.startup_s: dict[str, float] = {}

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.dir / f"{name}.log", "wb")
        self.procs[name] = subprocess.Popen([str(bin_dir() / name), *args], stdout=log, stderr=subprocess.STDOUT,
                                            stdin=subprocess.DEVNULL, start_new_session=True,
                                            preexec_fn=_die_with_parent)

    def log_tail(self, name: str, n: int = 30) -> str:
        try:
            return "\n".join((self.dir / f"{name}.log").read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""

    def _check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() is not None:
                raise RuntimeError(f"{name} exited with {p.returncode}:\n{self.log_tail(name)}")

    def start(self, timeout: float = 90.0) -> None:
        t0 = time.monotonic()
        d = self.dir
        (d / "tokens.csv").write_text(f'{ADMIN_TOKEN},rlmesh-admin,1,"system:masters"\n'
                                      f"{LIMITED_TOKEN},{LIMITED_USER},2\n")
        subprocess.run(["openssl", "genrsa", "-out", str(d / "sa.key"), "2048"], check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(d / "sa.key"), "-pubout", "-out", str(d / "sa.pub")],
                       check=True, capture_output=True)
        etcd_port, peer_port = _free_port(), _free_port()
        self._spawn("etcd", [
            "--name", "rlmesh-test", "--data-dir", str(d / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"rlmesh-test=http://127.0.0.1:{peer_port}",
            "--logger", "zap", "--log-level", "error", "--unsafe-no-fsync"])
        self._spawn("kube-apiserver", [
            f"--etcd-servers=http://127.0.0.1:{etcd_port}", "--bind-address=127.0.0.1",
            "--advertise-address=127.0.0.1", f"--secure-port={self.port}", "--insecure-port=0",
            f"--cert-dir={d / 'certs'}", f"--token-auth-file={d / 'tokens.csv'}", "--authorization-mode=RBAC",
            "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
            f"--service-account-key-file={d / 'sa.pub'}", f"--service-account-signing-key-file={d / 'sa.key'}",
            "--service-cluster-ip-range=10.0.0.0/24", "--event-ttl=10m", "--v=0"])
        self._wait_ready(t0 + timeout)
        ca = d / "certs" / "apiserver.crt"  # self-signed by the API server for 127.0.0.1 and localhost
        self.admin_kubeconfig.write_text(kubeconfig_text(self.server, ADMIN_TOKEN, "rlmesh-admin", ca))
        self.limited_kubeconfig.write_text(kubeconfig_text(self.server, LIMITED_TOKEN, LIMITED_USER, ca))
        self.startup_s["apiserver_ready"] = time.monotonic() - t0
        common = [f"--kubeconfig={self.admin_kubeconfig}", "--leader-elect=false", "--port=0",
                  f"--authentication-kubeconfig={self.admin_kubeconfig}",
                  f"--authorization-kubeconfig={self.admin_kubeconfig}", "--bind-address=127.0.0.1"]
        self._spawn("kube-controller-manager", [
            *common, f"--secure-port={_free_port()}",
            "--controllers=serviceaccount,serviceaccount-token,garbagecollector",
            f"--service-account-private-key-file={d / 'sa.key'}", "--use-service-account-credentials=false"])
        self._spawn("kube-scheduler", [*common, f"--secure-port={_free_port()}"])

    def _wait_ready(self, deadline: float) -> None:
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        req = urllib.request.Request(f"{self.server}/readyz", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
        last = ""
        while time.monotonic() < deadline:
            self._check_alive()
            try:
                with urllib.request.urlopen(req, context=ctx, timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception as exc:  # noqa: BLE001 - not up yet
                last = str(exc)
            time.sleep(0.2)
        raise RuntimeError(f"kube-apiserver not ready in time ({last}):\n{self.log_tail('kube-apiserver')}")

    def stop(self) -> None:
        for name in ("kube-scheduler", "kube-controller-manager", "kube-apiserver", "etcd"):
            p = self.procs.get(name)
            if p is not None and p.poll() is None:
                p.terminate()
        for p in self.procs.values():
            try:
                p.wait(timeout=2)  # the API server would otherwise wait for open watches to drain
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        if not os.environ.get("RLMESH_K8S_KEEP"):
            shutil.rmtree(self.dir, ignore_errors=True)
