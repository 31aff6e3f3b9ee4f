"""Which Host names `fogshift dashboard` serves (DNS rebinding), and the names it is given."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fogshift.exceptions import InvalidInput
from fogshift.web.app import DashboardConfig, create_app, foreign_origin
from fogshift.web.auth import Sessions
from fogshift.web.serve import (
    allowed_hosts,
    check_host_name,
    check_spec_dir,
    link_host,
    named_hosts,
)
from tests.web.test_app import TOKEN, StandIn, logged_in


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


def test_behind_a_proxy_posts_from_a_page_at_a_given_name_are_taken(tmp_path: Path) -> None:
    # A TLS proxy in front (nginx's default) sends its own Host, so the browser's Origin
    # is not the Host: every action post was refused as from another site. A page at a
    # name given with --allow-host is the dashboard's own; any other site's still is not.
    names = ("dash.example.org",)
    config = DashboardConfig(tmp_path, interval_s=3600, allowed_hosts=allowed_hosts(
        "127.0.0.1", names), named_hosts=named_hosts(names))  # fmt: skip
    stand_in = StandIn()
    sessions = Sessions(operator_token=TOKEN)
    app = create_app(stand_in, sessions, config)  # type: ignore[arg-type]
    form = {"target": "fog-b", "mode": "literal", "confirmed": "true"}
    with TestClient(app, base_url="http://127.0.0.1:8765") as web:
        logged_in(web, sessions)
        # Another port or plain HTTP of the named host may be another service's page.
        for origin in ("https://evil.example", "https://dash.example.org.evil", "null",
                       "ftp://dash.example.org", "https://[::1", "https://dash.example.org:9999",
                       "http://dash.example.org", "https://127.0.0.1"):  # fmt: skip
            answer = web.post("/pipelines/p/elements/pick/migrate", data=form,
                              headers={"origin": origin})  # fmt: skip
            assert answer.status_code == 403 and stand_in.actions == [], origin
        for n, origin in enumerate(("https://Dash.Example.org", "https://dash.example.org:443")):
            answer = web.post("/pipelines/p/elements/pick/migrate", data=form,
                              headers={"origin": origin})  # fmt: skip
            assert answer.status_code == 200 and len(stand_in.actions) == n + 1, answer.text
    # A loopback name or an address given is served, but its pages are any local service's.
    assert named_hosts(["Dash.Example.org.", "localhost", "127.0.0.1", "::1", "fog.lan"]) == (
        "dash.example.org", "fog.lan")  # fmt: skip
    # Without the name given, such a post is another site's, as before.
    assert foreign_origin("https://dash.example.org", "127.0.0.1:8765", ())
    assert not foreign_origin("http://127.0.0.1:8765", "127.0.0.1:8765", ())
    assert not foreign_origin(None, "127.0.0.1:8765", ())


def test_the_spec_folder_must_be_a_folder(tmp_path: Path) -> None:
    assert check_spec_dir(tmp_path) == tmp_path
    (tmp_path / "a-file").write_text("x")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    for path, received in ((tmp_path / "a-file", "a file"),
                           (tmp_path / "specz", "nothing at that path"),
                           (tmp_path / ("x" * 300), "File name too long"),
                           (tmp_path / "loop", "Too many levels of symbolic links")):  # fmt: skip
        with pytest.raises(InvalidInput) as err:
            check_spec_dir(path)
        assert "--spec-dir" in err.value.message and err.value.received == received
        assert err.value.expected and err.value.hint


def test_the_login_link_names_an_address_a_browser_can_open() -> None:
    # On every address, the link was to http://0.0.0.0:PORT/..., which no browser opens.
    assert link_host("0.0.0.0") == "127.0.0.1"
    assert link_host("::") == link_host("0:0::0") == "[::1]"
    assert link_host("::1") == "[::1]"
    assert link_host("192.168.7.5") == "192.168.7.5"
    assert link_host("localhost") == "localhost"
