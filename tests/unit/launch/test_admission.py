"""The admission rule (rlmesh/launch/admission.py): the smaller of what memory and descriptors hold,
unless RLMESH_MAX_PROCS says; a refusal is one line with the setting, the limit and both fixes."""

import pytest

from rlmesh.errors import ConfigError
from rlmesh.launch.admission import CONTROLLER_FDS_PER_PROC, PROC_BYTES, admit, capacity

GiB = 1 << 30


def test_memory_limits_a_host_with_descriptors_to_spare():
    cap = capacity(mem_available=8 * GiB, fds_free=20_000)
    assert cap.procs == 8 * GiB // PROC_BYTES == 32
    assert cap.fits(32) and not cap.fits(33)
    assert cap.limited_by == "8.0 GiB available / 256 MiB a proc"


def test_descriptors_limit_a_controller_with_few_left():
    cap = capacity(mem_available=64 * GiB, fds_free=1000)
    assert cap.procs == 1000 // CONTROLLER_FDS_PER_PROC
    assert cap.limited_by == f"1000 free file descriptors / {CONTROLLER_FDS_PER_PROC} a proc"


def test_the_setting_replaces_the_rule():
    assert capacity(mem_available=1 * GiB, fds_free=10, max_procs=500).procs == 500


def test_a_refusal_names_the_setting_the_limit_and_both_fixes(monkeypatch):
    monkeypatch.setenv("RLMESH_MAX_PROCS", "4")
    admit(4, "generator.replicas=2", "lower generator.replicas")  # fits: nothing raised
    with pytest.raises(ConfigError) as err:
        admit(5, "generator.replicas=3", "lower generator.replicas")
    assert str(err.value) == ("generator.replicas=3 needs 5 procs on this host, which holds 4 now (RLMESH_MAX_PROCS=4); "
                              "lower generator.replicas, or set RLMESH_MAX_PROCS=5 to start them anyway")
