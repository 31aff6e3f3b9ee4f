"""`fogshift dashboard`: serve the dashboard of the cluster under a home, in the foreground."""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import stat
from collections.abc import Callable, Sequence
from pathlib import Path

import uvicorn

from fogshift.common.http import SERVER_KEEP_ALIVE_S, is_loopback
from fogshift.exceptions import InvalidInput
from fogshift.supervisor.cluster import load_cluster, orchestrator_client
from fogshift.web.app import (
    ANY_ADDRESS,
    LOOPBACK_NAMES,
    DashboardConfig,
    Orchestrator,
    canonical_host,
    create_app,
)
from fogshift.web.auth import Sessions


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


#: A label of a DNS name: letters, digits and inner hyphens.
_LABEL = re.compile(r"[A-Za-z0-9]([A-Za-z0-9-]{0,61}[A-Za-z0-9])?")


def check_host_name(name: str) -> str:
    """``name``, a DNS name a user may give the dashboard to be reached by.

    Raises:
        InvalidInput: It is not one (a URL, a port, a pattern).
    """
    labels = name.removesuffix(".").split(".")
    if not 0 < len(name) <= 253 or not all(_LABEL.fullmatch(label) for label in labels):
        raise InvalidInput(
            f"{name!r} is not a host name the dashboard can be reached by",
            expected="a DNS name: labels of letters, digits and hyphens joined by dots",
            received=repr(name),
            hint="give the name alone, such as dashboard.example.org (no scheme, port or *)",
        )
    return name


def allowed_hosts(host: str, names: Sequence[str] = ()) -> tuple[str, ...]:
    """The Host names a dashboard listening on ``host`` serves: the loopback names, the
    address it listens on, and ``names`` (the DNS names users reach it by). Listening on
    every address (``0.0.0.0``, ``::``), any of this machine's IP addresses and its own host
    names too — never any name at all: a page of another site whose name its DNS points at
    this machine (DNS rebinding) would be served, from the user's browser."""
    try:
        everywhere = ipaddress.ip_address(host).is_unspecified  # 0.0.0.0, ::, 0:0:...:0
    except ValueError:
        everywhere = False
    own = (ANY_ADDRESS, socket.gethostname(), socket.getfqdn()) if everywhere else (host,)
    named = (canonical_host(n) for n in (*LOOPBACK_NAMES, *own, *names))
    return tuple(dict.fromkeys(n for n in named if n))


def named_hosts(names: Sequence[str]) -> tuple[str, ...]:
    """Of the DNS names given with ``--allow-host``, those whose pages' posts are taken as
    the dashboard's own (:attr:`DashboardConfig.named_hosts`): not a loopback name or an
    address, where any local service's page would be."""
    named = (canonical_host(n) for n in names)
    return tuple(n for n in named if n not in LOOPBACK_NAMES and not _is_address(n))


def _is_address(name: str) -> bool:
    try:
        ipaddress.ip_address(name.strip("[]"))
    except ValueError:
        return False
    return True


def check_spec_dir(spec_dir: Path) -> Path:
    """``spec_dir``, a folder the relative paths of specs deployed from the browser can be
    resolved against.

    Raises:
        InvalidInput: It is not a folder (a typo would refuse every such spec later, each
            time naming a file missing from a folder that is not there).
    """
    try:
        if stat.S_ISDIR(os.stat(spec_dir).st_mode):
            return spec_dir
        received = "a file"
    except (FileNotFoundError, NotADirectoryError):
        received = "nothing at that path"
    except OSError as exc:  # a name too long, a symlink loop, a folder not to be looked into
        received = exc.strerror or str(exc)
    raise InvalidInput(
        f"--spec-dir {str(spec_dir)!r} is not a folder",
        expected="an existing folder (the one specs' relative paths start from)",
        received=received,
        hint="give the folder your specs' input files are in; by default the current one",
    )


def link_host(host: str) -> str:
    """How the login link names the address ``host``: in brackets if IPv6, and a loopback
    address for a wildcard one (a browser cannot open ``0.0.0.0``; the dashboard answers on
    loopback too, and from elsewhere by this machine's address or name)."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if address.is_unspecified:
        return "[::1]" if address.version == 6 else "127.0.0.1"
    return f"[{address.compressed}]" if address.version == 6 else host


def serve(
    home: Path,
    host: str,
    port: int,
    spec_dir: Path,
    say: Callable[[str], None],
    interval_s: float = 1.0,
    names: Sequence[str] = (),
    tls_proxy: bool = False,
) -> None:
    """Serve until interrupted; ``say`` gets the one-time login URL first.

    Args:
        names: DNS names users reach the dashboard by (besides its address): see
            :func:`allowed_hosts`.
        tls_proxy: Users reach it over HTTPS through a proxy: see
            :attr:`DashboardConfig.tls_proxy`.

    Raises:
        FogshiftError: No cluster under ``home`` (its file or token cannot be read), or the
            address cannot be bound.
    """
    names = tuple(check_host_name(n) for n in names)
    check_spec_dir(spec_dir)
    _, token = load_cluster(home)  # refuses a home without a cluster, clearly
    client = orchestrator_client(home)
    sessions = Sessions(operator_token=token)
    config = DashboardConfig(
        spec_dir, interval_s, allowed_hosts=allowed_hosts(host, names),
        named_hosts=named_hosts(names), tls_proxy=tls_proxy,
    )  # fmt: skip
    app = create_app(Orchestrator(client), sessions, config)
    sock = bind(host, port)
    bound = sock.getsockname()[1]
    shown = link_host(host)
    if tls_proxy:
        say("behind a TLS proxy: log in at its https:// address, with the link's path (the "
            "session cookie is never sent over plain HTTP)")  # fmt: skip
    elif not is_loopback(host):
        say(f"warning: serving on {host}, not loopback: plain HTTP, so anyone on that network "
            "can read the pages and the session cookie (put TLS in front of it)")  # fmt: skip
    say(f"fogshift dashboard of the cluster under {home}")
    say(f"open: http://{shown}:{bound}/login?token={sessions.login_token}")
    if shown in ("127.0.0.1", "[::1]") and not is_loopback(host):  # every address
        say(f"(listening on {host}: from another machine, the same link with this machine's "
            "address or a name given with --allow-host in place of the address)")  # fmt: skip
    say(f"(the link works once, within {sessions.link_s / 60:.0f} minutes; Ctrl-C stops the "
        "dashboard)")  # fmt: skip
    server = uvicorn.Server(
        uvicorn.Config(app, log_level="warning", timeout_keep_alive=SERVER_KEEP_ALIVE_S)
    )
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        client.close()
