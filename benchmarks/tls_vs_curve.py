"""Which encryption for connections off loopback: TLS 1.3 (Python ssl / OpenSSL) or CurveZMQ (libzmq / libsodium).

    python benchmarks/tls_vs_curve.py [--n 2000] [--mib 64]

Measures, between two processes on this machine, in the same run: the round trip of
a 16-byte message and the time to move ``--mib`` MiB, over plain TCP, TLS 1.3 over
TCP (a self-signed certificate made with ``openssl`` for the run), zmq without
security, and zmq with CURVE. The decision and the figures are in docs/actors.md
(Security).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import socket
import ssl
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _common import Report, add_common_args, banner, median, timed  # noqa: E402

CHUNK = 1 << 20


def _recv_exact(s, n: int, buf: bytearray | None = None) -> None:
    view = memoryview(buf if buf is not None else bytearray(n))
    got = 0
    while got < n:
        k = s.recv_into(view[got:], n - got)
        if not k:
            raise ConnectionError("peer closed")
        got += k


def _tcp_server(port_q, certs) -> None:
    ls = socket.create_server(("127.0.0.1", 0))
    port_q.put(ls.getsockname()[1])
    conn, _ = ls.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if certs:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_cert_chain(*certs)
        conn = ctx.wrap_socket(conn, server_side=True)
    buf = bytearray(CHUNK)
    while True:
        head = bytearray(9)
        _recv_exact(conn, 9, head)
        kind, n = head[0], int.from_bytes(head[1:], "little")
        if kind == 0:
            return
        left = n
        while left:  # drain the payload
            k = min(left, CHUNK)
            _recv_exact(conn, k, buf if k == CHUNK else None)
            left -= k
        conn.sendall(b"k")


def bench_tcp(n: int, mib: int, tls: bool) -> dict:
    certs = None
    if tls:
        d = tempfile.mkdtemp(prefix="rlmesh-tls-")
        certs = (os.path.join(d, "c.pem"), os.path.join(d, "k.pem"))
        subprocess.run(["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes",
                        "-keyout", certs[1], "-out", certs[0], "-days", "1", "-subj", "/CN=localhost"],
                       check=True, capture_output=True)
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_tcp_server, args=(q, certs), daemon=True)
    p.start()
    s = socket.create_connection(("127.0.0.1", q.get(timeout=30)))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    if tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_3
        ctx.load_verify_locations(certs[0])
        s = ctx.wrap_socket(s, server_hostname="localhost")
    small = b"\x01" + (16).to_bytes(8, "little") + b"x" * 16

    def rtt() -> None:
        s.sendall(small)
        s.recv(1)

    lat = timed(rtt, n)
    big = bytes(mib << 20)

    def transfer() -> None:
        s.sendall(b"\x01" + len(big).to_bytes(8, "little"))
        s.sendall(big)
        s.recv(1)

    bw = timed(transfer, 5, warmup=1)
    s.sendall(b"\x00" + bytes(8))
    p.join(5)
    return {"rtt_s": median(lat), "big_s": median(bw), "cipher": s.cipher()[0] if tls else ""}


def _zmq_server(port_q, keys) -> None:
    import zmq

    r = zmq.Context().socket(zmq.ROUTER)
    if keys:
        r.curve_server, r.curve_publickey, r.curve_secretkey = True, *keys
    port_q.put(r.bind_to_random_port("tcp://127.0.0.1"))
    while True:
        ident, msg = r.recv_multipart(copy=False)
        if len(msg) == 1 and msg.bytes == b"q":
            return
        r.send_multipart([ident, b"k"])


def bench_zmq(n: int, mib: int, curve: bool) -> dict:
    import zmq

    keys = zmq.curve_keypair() if curve else None
    q = mp.get_context("spawn").Queue()
    p = mp.get_context("spawn").Process(target=_zmq_server, args=(q, keys), daemon=True)
    p.start()
    d = zmq.Context.instance().socket(zmq.DEALER)
    if keys:
        pub, sec = zmq.curve_keypair()
        d.curve_serverkey, d.curve_publickey, d.curve_secretkey = keys[0], pub, sec
    d.connect(f"tcp://127.0.0.1:{q.get(timeout=30)}")
    small = b"x" * 16

    def rtt() -> None:
        d.send(small)
        d.recv()

    lat = timed(rtt, n)
    big = bytes(mib << 20)

    def transfer() -> None:
        d.send(big, copy=False)
        d.recv()

    bw = timed(transfer, 5, warmup=1)
    d.send(b"q")
    p.join(5)
    return {"rtt_s": median(lat), "big_s": median(bw)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--rounds", type=int, default=3, help="rounds of all four, the order rotating")
    add_common_args(ap)
    args = ap.parse_args()
    if args.smoke:
        args.n, args.mib, args.rounds = 100, 4, 2
    banner("TLS 1.3 vs CurveZMQ between two processes")
    print(f"# {ssl.OPENSSL_VERSION}")
    report = Report("tls_vs_curve", smoke=args.smoke, args=vars(args))
    benches = {"plain TCP socket": lambda: bench_tcp(args.n, args.mib, tls=False),
               "TLS 1.3 over TCP (Python ssl)": lambda: bench_tcp(args.n, args.mib, tls=True),
               "zmq, no security": lambda: bench_zmq(args.n, args.mib, curve=False),
               "zmq CURVE (CurveZMQ)": lambda: bench_zmq(args.n, args.mib, curve=True)}
    names = list(benches)
    res: dict[str, list[dict]] = {k: [] for k in names}
    for i in range(args.rounds):
        for name in names[i % 4:] + names[: i % 4]:
            res[name].append(benches[name]())
    print(f"\n{'transport, medians of rounds':<34}{'16 B round trip':>16}{f'{args.mib} MiB':>12}{'GB/s':>8}")
    for name in names:
        rtt, big = median([r["rtt_s"] for r in res[name]]), median([r["big_s"] for r in res[name]])
        cipher = res[name][0].get("cipher")
        print(f"{name:<34}{rtt * 1e6:>13.1f} µs{big * 1e3:>9.1f} ms{(args.mib << 20) / big / 1e9:>8.2f}"
              + (f"  ({cipher})" if cipher else ""))
        report.row(transport=name, rtt_us=rtt * 1e6, big_ms=big * 1e3)
    per = lambda a, b, k: [x[k] / y[k] for x, y in zip(res[a], res[b])]  # noqa: E731
    report.ratio("curve_vs_tls_rtt", per("zmq CURVE (CurveZMQ)", "TLS 1.3 over TCP (Python ssl)", "rtt_s"),
                 "CurveZMQ µs / TLS µs")
    report.ratio("curve_vs_tls_bulk", per("zmq CURVE (CurveZMQ)", "TLS 1.3 over TCP (Python ssl)", "big_s"),
                 "CurveZMQ s / TLS s")
    report.ratio("curve_vs_plain_zmq_bulk", per("zmq CURVE (CurveZMQ)", "zmq, no security", "big_s"),
                 "CurveZMQ s / plain zmq s")
    report.write(args.json)
    print(f"\nload average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")


if __name__ == "__main__":
    main()
