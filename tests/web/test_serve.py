"""Which Host names `fogshift dashboard` serves (DNS rebinding), and the names it is given."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fogshift.exceptions import InvalidInput
from fogshift.web.app import DashboardConfig, create_app
from fogshift.web.auth import Sessions
from fogshift.web.serve import allowed_hosts, check_host_name
from tests.web.test_app import StandIn


def served(allowed: tuple[str, ...], host: str, tmp_path: Path) -> bool:
    """Whether a dashboard allowing ``allowed`` answers a request naming ``host``."""
    config = DashboardConfig(tmp_path, interval_s=3600, allowed_hosts=allowed)
    app = create_app(StandIn(), Sessions(operator_token="o" * 32), config)  # type: ignore[arg-type]
    with TestClient(app) as web:
        return web.get("/login", headers={"host": host}).status_code != 400


def test_on_every_address_it_serves_addresses_and_its_own_names_not_any_name(
    tmp_path: Path,
) -> None:
    # Before, listening on 0.0.0.0 took any name: a page of another site whose DNS
    # points at this machine was served, from the user's browser (DNS rebinding).
    allowed = allowed_hosts("0.0.0.0", ["dash.example.org"])
    for host in ("10.1.2.3:8765", "[fe80::1]:8765", "localhost:8765", "dash.example.org",
                 f"{socket.gethostname()}:8765"):  # fmt: skip
        assert served(allowed, host, tmp_path), host
    for host in ("evil.example:8765", "10.1.2.3.evil.example", "dash.example.org.evil"):
        assert not served(allowed, host, tmp_path), host
    # Names as browsers send them: lower case (a Mac's host name has capitals), and a
    # name with the root's dot is the same name.
    mixed = allowed_hosts("0.0.0.0", ["Dash.Example.ORG"])
    for host in ("dash.example.org:8765", "DASH.example.org.", "LocalHost"):
        assert served(mixed, host, tmp_path), host


def test_on_one_address_it_serves_that_address_and_the_names_given(tmp_path: Path) -> None:
    allowed = allowed_hosts("192.168.7.5", ["fog.lan"])
    assert served(allowed, "192.168.7.5:8765", tmp_path)
    assert served(allowed, "fog.lan:8765", tmp_path)
    assert not served(allowed, "10.1.2.3:8765", tmp_path)  # another address: not its own
    assert allowed_hosts("::1") == ("127.0.0.1", "localhost", "[::1]")
    # Addresses as browsers write them: compressed (a dashboard on a long-form IPv6
    # address refused every request but loopback's), and every unspecified form is every
    # address.
    assert served(allowed_hosts("2001:db8:0:0::1"), "[2001:db8::1]:8765", tmp_path)
    assert served(allowed_hosts("2001:db8:0:0::1"), "[2001:DB8::1]:8765", tmp_path)
    assert served(allowed_hosts("0:0:0:0:0:0:0:0"), "10.1.2.3:8765", tmp_path)
    assert not served(allowed_hosts("0:0:0:0:0:0:0:0"), "evil.example", tmp_path)


@pytest.mark.parametrize(
    "name", ["http://dash.example.org", "dash.example.org:8765", "*", "*.example.org", "",
             "a..b", "-a.example", "x" * 64 + ".org", "a b"],
)  # fmt: skip
def test_names_that_are_no_dns_names_are_refused(name: str) -> None:
    with pytest.raises(InvalidInput) as err:
        check_host_name(name)
    assert "DNS name" in (err.value.expected or "") and err.value.hint


def test_dns_names_are_taken() -> None:
    for name in ("dash.example.org", "fog-a", "fog-a.lan.", "a1.b2"):
        assert check_host_name(name) == name
