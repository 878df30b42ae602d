"""A host cut off by taking its link down, its procs left running: detected, recovered, fenced.

``scenario.py partition``: work items go to procs on hosts 0 and 1 of three; host 1's link goes
down mid-stream. Its proc lives on (the launcher's kill cannot reach a cut-off host), is declared
dead by its heartbeat silence, and is replaced on host 2; its items are re-issued. Then the link
comes back with the old proc still alive: it dials the controller again, is refused and told to
exit (fenced), so there is never a second live copy of the proc. The workers' own controller-silence
limit is set far beyond the test, so only the fence can end the old one.
"""

import pytest

from netns_run import run_scenario

pytestmark = pytest.mark.timeout(300)  # a hang bound: at load 44 on 2 cores a scenario took 90-110 s
HOSTS = 3


@pytest.fixture(scope="module")
def seen(host_network, tmp_path_factory):
    return run_scenario(host_network, "partition", tmp_path_factory.mktemp("runs"), timeout=280,
                        extra_env={"RLMESH_CONTROLLER_TIMEOUT_S": "600"})


def test_a_cut_host_is_detected_and_replaced_while_its_proc_lives(seen, host_network):
    assert seen["old_alive_while_cut"]
    assert seen["new"]["incarnation"] == seen["old"]["incarnation"] + 1
    assert seen["new"]["host"] == host_network.hosts[2].hostname
    died = [e for e in seen["events"] if e["event"] == "died"]
    assert died and "heartbeat" in died[0]["reason"]


def test_nothing_is_lost(seen, host_network):
    assert seen["items"] == list(range(40))
    assert seen["reissued"] >= 1
    assert host_network.hosts[2].hostname in seen["item_hosts"]


def test_the_old_incarnation_is_fenced_when_its_link_comes_back(seen, host_network):
    fenced = [e for e in seen["events"] if e["event"] == "fenced"]
    assert [e["incarnation"] for e in fenced] == [seen["old"]["incarnation"]]
    # one live copy: rank 1 answers from its replacement only
    assert {(a["pid"], a["host"]) for a in seen["after"]} == {(seen["new"]["pid"], host_network.hosts[2].hostname)}
