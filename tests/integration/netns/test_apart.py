"""One mesh across three hosts that are network namespaces: every cross-host path over a real interface.

The controller listens on the bridge and its procs each bind their own host's address, so every
channel is CurveZMQ (``rlmesh.transport``'s rule off loopback). One controller program
(``scenario.py apart``) serves the module; each test checks one path of what it saw.
"""

import pytest

from netns_run import run_scenario

pytestmark = pytest.mark.timeout(300)  # a hang bound: at load 44 on 2 cores a scenario took 90-110 s
HOSTS = 3


@pytest.fixture(scope="module")
def seen(host_network, tmp_path_factory):
    return run_scenario(host_network, "apart", tmp_path_factory.mktemp("runs"), timeout=280)


def test_procs_run_on_their_own_hosts_and_bind_off_loopback(seen, host_network):
    assert [w["host"] for w in seen["where"]] == [h.hostname for h in host_network.hosts]
    assert seen["controller"].startswith(f"tcp://{host_network.address}:") and "#c" in seen["controller"]
    for addr, h in zip(seen["proc_addrs"], host_network.hosts):
        assert addr.startswith(f"tcp://{h.address}:") and "#c" in addr  # CurveZMQ, on the host's address


def test_a_call_crosses_the_bridge_encrypted(seen):
    assert seen["echo_ok"]
    assert seen["wire_bytes"] > 64 * 1024  # the 110 KB argument and its echo crossed host 1's link...
    assert not seen["marker_on_wire"]  # ...and not one copy of it in clear


def test_a_peer_without_the_job_keys_is_refused(seen):
    s = seen["strangers"]
    assert "HANDSHAKE_FAILED_AUTH" in s["wrong-key"]["events"]  # the ZAP handler refused its key
    for kind in ("plain", "wrong-key"):
        assert "HANDSHAKE_SUCCEEDED" not in s[kind]["events"] and not s[kind]["reply"], (kind, s[kind])
    # with the job's CurveZMQ keys but no channel MAC the message is dropped before any unpickling
    assert "HANDSHAKE_SUCCEEDED" in s["job-key"]["events"] and not s["job-key"]["reply"]
    assert seen["still_serving"]


def test_telemetry_from_remote_procs_arrives(seen, host_network):
    assert seen["rows"] == [{"host": h.hostname, "n": 5} for h in sorted(host_network.hosts, key=lambda h: h.hostname)]
    assert {r["host"] for r in seen["span_hosts"]} == {h.hostname for h in host_network.hosts}


def test_the_debugger_attaches_across_hosts(seen, host_network):
    d = seen["debug"]
    assert d["host"] == host_network.hosts[2].hostname and d["addr"].startswith(f"tcp://{host_network.hosts[2].address}:")
    assert d["code"] == 0 and d["result"] == 42, d["screen"]


def test_weights_are_pulled_over_tcp_between_hosts(seen, host_network):
    w = seen["weights"]
    for pull, h in zip(w["pulls"], host_network.hosts[1:]):
        assert pull["host"] == h.hostname and pull["transport"] == "tcp" and pull["version"] == 1
        assert pull["sum"] == w["published_sum"] and pull["b"] == [float(i) for i in range(7)]
        assert pull["bytes"] >= 4 << 20


def test_the_workspace_goes_along_the_chain(seen):
    assert [r["error"] for r in seen["workspace"]] == ["", "", ""]
    assert all(r["transport"] == "tcp" and r["bytes"] >= 3 << 20 for r in seen["workspace"])
    assert seen["imported"] == ["synced"] * 3
