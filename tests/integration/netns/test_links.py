"""The simulated hosts' links do what they are set to, and can be changed, cut and restored mid-test.

Plain sockets in the hosts' namespaces (no rlmesh procs): host 1 sends UDP datagrams to an echo on
host 0. The delay is ``netem``'s where the kernel has it, else the delay line's (TAP links through a
forwarding process); rates are ``tbf``. Lower bounds only: a shaped link is never faster than its
shape, whatever the machine's load.
"""

import subprocess
import sys

import pytest

from rlmesh.launch.netns import HostNetwork, Link, has_netem

pytestmark = pytest.mark.timeout(60)

ECHO = ("import socket,sys\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.bind((sys.argv[1],7))\n"
        "print('up',flush=True)\nwhile 1:\n d,p=s.recvfrom(70000)\n s.sendto(d,p)\n")
PROBE = ("import socket,sys,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\ns.settimeout(float(sys.argv[3]))\n"
         "got,ts=0,[]\nfor i in range(int(sys.argv[2])):\n t=time.perf_counter()\n try:\n"
         "  s.sendto(b'x'*int(sys.argv[4]),(sys.argv[1],7)); s.recv(70000); got+=1; ts.append(time.perf_counter()-t)\n"
         " except OSError: pass\n"
         "print(got, min(ts) if ts else -1)\n")


@pytest.fixture(scope="module")
def net():
    with HostNetwork(2, delay_line=not has_netem()) as n:
        echo = subprocess.Popen([*n.hosts[0].prefix(), sys.executable, "-c", ECHO, n.hosts[0].address],
                                stdout=subprocess.PIPE, text=True)
        assert echo.stdout.readline().strip() == "up"
        try:
            yield n
        finally:
            echo.kill()
            echo.wait()


def probe(net: HostNetwork, count: int = 5, timeout: float = 2.0, size: int = 16) -> tuple[int, float]:
    """(echoes received of ``count``, fastest round trip in seconds) from host 1 to host 0."""
    out = subprocess.run([*net.hosts[1].prefix(), sys.executable, "-c", PROBE, net.hosts[0].address, str(count),
                          str(timeout), str(size)], capture_output=True, text=True, timeout=30, check=True)
    got, fastest = out.stdout.split()
    return int(got), float(fastest)


def test_delay_and_loss_are_applied_and_changed_mid_test(net):
    for h in net.hosts:
        net.shape(h, Link(delay_ms=5))  # each end of each link: 20 ms host to host
    got, fastest = probe(net)
    assert got == 5 and fastest >= 0.020
    for h in net.hosts:
        net.shape(h, Link())
    got, fastest = probe(net)
    assert got == 5 and fastest < 0.020
    net.shape(0, Link(loss_pct=100))
    assert probe(net, count=3, timeout=0.3)[0] == 0
    net.shape(0, Link())
    assert probe(net)[0] == 5


def test_a_rate_limits_what_crosses(net):
    net.shape(1, Link(mbit=8))  # 1 MB/s: 20 datagrams of 60 KB (1.2 MB) take at least ~0.8 s one way
    try:
        out = subprocess.run([*net.hosts[1].prefix(), sys.executable, "-c",
                              "import socket,sys,time\ns=socket.socket(socket.AF_INET,socket.SOCK_DGRAM)\n"
                              "t=time.perf_counter()\nfor i in range(20): s.sendto(b'x'*60000,(sys.argv[1],9))\n"
                              "print(time.perf_counter()-t)\n", net.hosts[0].address],
                             capture_output=True, text=True, timeout=30, check=True)
    finally:
        net.shape(1, Link())
    assert float(out.stdout) >= 0.5  # held back by the token bucket (256 KB of burst, 100 ms of queue)


def test_a_cut_link_carries_nothing_until_restored(net):
    assert net.hosts[1].reachable()
    net.cut(1)
    try:
        assert not net.hosts[1].reachable()
        assert probe(net, count=3, timeout=0.3)[0] == 0
    finally:
        net.restore(1)
    assert net.hosts[1].reachable()
    assert probe(net)[0] == 5
