"""The dashboard's serving rules, as pure logic: loopback by default, TLS off it, tokens compared exactly."""

import pytest

pytest.importorskip("starlette")

from rlmesh.dashboard.auth import DashboardSecurityError, ServeSecurity, is_loopback_host, new_token  # noqa: E402


def test_loopback_names():
    assert is_loopback_host("127.0.0.1") and is_loopback_host("::1") and is_loopback_host("localhost")
    assert not is_loopback_host("0.0.0.0") and not is_loopback_host("10.1.2.3")


def test_off_loopback_without_tls_is_refused_naming_the_fix():
    ServeSecurity("127.0.0.1", new_token()).check()
    ServeSecurity("0.0.0.0", new_token(), "c.pem", "k.pem").check()
    with pytest.raises(DashboardSecurityError, match="--certfile"):
        ServeSecurity("0.0.0.0", new_token()).check()
    with pytest.raises(DashboardSecurityError, match="go together"):
        ServeSecurity("127.0.0.1", new_token(), "c.pem", None).check()
    with pytest.raises(DashboardSecurityError, match="too short"):
        ServeSecurity("127.0.0.1", "abc").check()


def test_tokens_are_random_and_long():
    a, b = new_token(), new_token()
    assert a != b and len(a) >= 32
