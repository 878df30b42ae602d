"""Hosts that are really apart: a network namespace per host on a bridge of the module's own.

``host_network`` (module scope) makes ``HOSTS`` hosts (a module sets it; default 3) with
:class:`rlmesh.launch.netns.HostNetwork`, which takes a ``10.80.K.0/24`` no other module, xdist
worker or benchmark holds; it is removed, with any proc still running on it, when the module ends,
pass or fail. ``netns_run.run_scenario`` runs a controller program of ``scenario.py`` in a fresh interpreter
listening on the bridge (a controller binds once per process, so it cannot be this one, whose
controller other test modules of the worker share on loopback) and returns its JSON result.
"""

import pytest

from rlmesh.launch.netns import HostNetwork


@pytest.fixture(scope="module")
def host_network(request):
    net = HostNetwork(getattr(request.module, "HOSTS", 3))
    try:
        yield net
    finally:
        net.close()
