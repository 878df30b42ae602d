"""Who may see the dashboard: a token in the URL, the way Jupyter does it, and loopback unless TLS.

Why: the pages show everything a run recorded and run SQL on it. The server binds to
loopback by default; any request without the token gets 403, whatever the address. The
first page opened with ``?token=...`` sets a cookie (HttpOnly, SameSite=Strict) so the
page's own requests carry it; scripts may send ``Authorization: token <token>`` instead.
Off loopback the token alone would cross the network in clear text, so the server refuses
to start there without a TLS certificate and key (the rest of rlmesh likewise never leaves
loopback unauthenticated and unencrypted).
"""

from __future__ import annotations

import ipaddress
import secrets
import socket
from dataclasses import dataclass
from typing import Any, Awaitable, Callable
from urllib.parse import parse_qs

from rlmesh import settings

TOKEN_PARAM = "token"
TOKEN_ENV = settings.DASHBOARD_TOKEN.name
"""Where ``rlmesh dashboard`` takes its token from when ``--token`` is not given."""
DASHBOARD_JSON = "dashboard.json"
"""``runs/<run>/dashboard.json`` (mode 0600): the URL of the dashboard serving that run, while it serves."""


class DashboardSecurityError(ValueError):
    """A serving setting that would expose the dashboard; the message names the fix."""


def new_token() -> str:
    return secrets.token_urlsafe(24)


def is_loopback_host(host: str) -> bool:
    """True for ``127.0.0.1``, ``::1``, ``localhost`` (and every name resolving only to loopback)."""
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        pass
    try:
        addrs = {info[4][0] for info in socket.getaddrinfo(host, None)}
    except OSError:
        return False
    return bool(addrs) and all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs)  # type: ignore[union-attr]  # an address is a str


@dataclass(frozen=True)
class ServeSecurity:
    """Where and how the server listens; :meth:`check` refuses an exposed setting."""

    host: str
    token: str
    certfile: str | None = None
    keyfile: str | None = None

    @property
    def tls(self) -> bool:
        return bool(self.certfile and self.keyfile)

    def check(self) -> None:
        if len(self.token) < 16:
            raise DashboardSecurityError("dashboard token is too short (use at least 16 characters, or leave it "
                                         "unset to get a random one)")
        if bool(self.certfile) != bool(self.keyfile):
            raise DashboardSecurityError("--certfile and --keyfile go together (the TLS certificate and its key)")
        if not is_loopback_host(self.host) and not self.tls:
            raise DashboardSecurityError(
                f"refusing to serve the dashboard on {self.host!r} without TLS: the token would cross the network "
                "in clear text. Add --certfile CERT.pem --keyfile KEY.pem, or keep the default --host 127.0.0.1 "
                "and reach it through an SSH tunnel (ssh -L 8299:127.0.0.1:8299 host)")


class TokenMiddleware:
    """ASGI middleware: 403 unless the request carries the token (query, cookie or header)."""

    def __init__(self, app: Any, token: str, cookie_name: str, secure_cookie: bool):
        self.app = app
        self.token = token
        self.cookie_name = cookie_name
        self.secure = secure_cookie

    def _presented(self, scope: dict[str, Any]) -> tuple[str | None, bool]:
        """The token the request carries, and whether it came in the URL (then a cookie is set)."""
        qs = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if qs.get(TOKEN_PARAM):
            return qs[TOKEN_PARAM][0], True
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                parts = value.decode("latin-1").split(None, 1)
                if len(parts) == 2 and parts[0].lower() in ("token", "bearer"):
                    return parts[1].strip(), False
            if name == b"cookie":
                for part in value.decode("latin-1").split(";"):
                    k, _, v = part.strip().partition("=")
                    if k == self.cookie_name:
                        return v, False
        return None, False

    async def __call__(self, scope: dict[str, Any], receive: Callable[[], Awaitable[Any]],
                       send: Callable[[Any], Awaitable[None]]) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        token, in_url = self._presented(scope)
        if token is None or not secrets.compare_digest(token.encode(), self.token.encode()):
            from starlette.responses import PlainTextResponse  # deferred: optional extra rlmesh[dashboard]

            await PlainTextResponse("403: this dashboard needs its token: open the URL `rlmesh dashboard` printed "
                                    "(…?token=...)", status_code=403)(scope, receive, send)
            return
        if not in_url:
            await self.app(scope, receive, send)
            return
        cookie = (f"{self.cookie_name}={self.token}; Path=/; HttpOnly; SameSite=Strict"
                  + ("; Secure" if self.secure else ""))

        async def send_with_cookie(message: Any) -> None:
            if message["type"] == "http.response.start":
                message = dict(message, headers=list(message.get("headers", [])) + [(b"set-cookie", cookie.encode())])
            await send(message)

        await self.app(scope, receive, send_with_cookie)
