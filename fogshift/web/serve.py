"""`fogshift dashboard`: serve the dashboard of the cluster under a home, in the foreground."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Callable
from pathlib import Path

import uvicorn

from fogshift.common.http import SERVER_KEEP_ALIVE_S
from fogshift.exceptions import InvalidInput
from fogshift.supervisor.cluster import load_cluster, orchestrator_client
from fogshift.web.app import LOOPBACK_NAMES, DashboardConfig, Orchestrator, create_app
from fogshift.web.auth import Sessions


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, 127.0.0.0/8, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (port 0: one the system picks).

    Raises:
        InvalidInput: The address cannot be bound (in use, not this machine's).
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise InvalidInput(
            f"the dashboard cannot listen on {host}:{port}: {exc.strerror}",
            expected="a free port on an address of this machine",
            received=f"{host}:{port}",
            hint="--port 0 lets the system choose a free port",
        ) from None
    sock.listen(64)
    return sock


def serve(
    home: Path,
    host: str,
    port: int,
    spec_dir: Path,
    say: Callable[[str], None],
    interval_s: float = 1.0,
) -> None:
    """Serve until interrupted; ``say`` gets the one-time login URL first.

    Raises:
        FogshiftError: No cluster under ``home`` (its file or token cannot be read), or the
            address cannot be bound.
    """
    _, token = load_cluster(home)  # refuses a home without a cluster, clearly
    client = orchestrator_client(home)
    sessions = Sessions(operator_token=token)
    if host in ("0.0.0.0", "::"):  # every address: any name may reach it
        allowed: tuple[str, ...] = ("*",)
    else:
        allowed = tuple(
            dict.fromkeys((*LOOPBACK_NAMES, host, f"[{host}]" if ":" in host else host))
        )
    config = DashboardConfig(spec_dir, interval_s, allowed_hosts=allowed)
    app = create_app(Orchestrator(client), sessions, config)
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    shown = f"[{host}]" if ":" in host else host
    if not is_loopback(host):
        say(f"warning: serving on {host}, not loopback: plain HTTP, so anyone on that network "
            "can read the pages and the session cookie (put TLS in front of it)")  # fmt: skip
    say(f"fogshift dashboard of the cluster under {home}")
    say(f"open: http://{shown}:{bound}/login?token={sessions.login_token}")
    say("(the link works once; Ctrl-C stops the dashboard)")
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", timeout_keep_alive=SERVER_KEEP_ALIVE_S)
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        client.close()
