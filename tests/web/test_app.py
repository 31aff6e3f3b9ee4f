"""The dashboard's pages and actions in-process, against a stand-in orchestrator: login and
cookies, confirmation before every action, errors with expected/received/hint, names checked,
cross-site posts refused. The real thing, in a real browser: test_dashboard_browser.py."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from fogshift.common.exceptions import NoAnswer
from fogshift.common.waiting import wait_until
from fogshift.contracts import (
    DeadLetter,
    DeleteResult,
    EventPage,
    GroupMigrationReport,
    GroupMigrationStatus,
    HopLatency,
    KeyWaiting,
    MigrationMode,
    MigrationReport,
    MigrationStatus,
    NodeView,
    OperationView,
    PipelineState,
    PipelineStatus,
    PlanView,
    RestoreReport,
    RestoreStatus,
    StandbyStatus,
    StreamEvent,
    TwinEntry,
    TwinState,
)
from fogshift.exceptions import Conflict, FogshiftError, InvalidInput, NotFound, Unavailable
from fogshift.migration.exceptions import MigrationFailed
from fogshift.web.app import MAX_BODY_BYTES, MAX_SPEC_BYTES, DashboardConfig, create_app
from fogshift.web.auth import COOKIE, Sessions, cookie_name
from fogshift.web.history import History, Sampler
from tests.web.test_graph import element
from tests.web.test_history import node

TOKEN = "o" * 32


class StandIn:
    """Answers like the orchestrator's REST API; records the actions it was asked for."""

    def __init__(self) -> None:
        self.actions: list[tuple[Any, ...]] = []
        self.letters_read = []
        self.refuse: FogshiftError | None = None
        #: A group migration whose last PE fails (and is rolled back); "no report": it
        #: failed before its migration had one.
        self.fail_last: bool | str = False
        self.reason = "processor 'pick' raised KeyError: 'value'"

    def pipelines(self) -> list[PipelineStatus]:
        return [self.pipeline("p")]

    def pipeline(self, name: str) -> PipelineStatus:
        if name == "ecg":
            return PipelineStatus(
                pipeline="ecg", status=PipelineState.RUNNING,
                elements=[element("wear", "cloud", [], kind="ecg-source"),
                          element("band", "fog-a", ["wear"], kind="bandpass"),
                          element("cls", "fog-a", ["band"], kind="classify")],
            )  # fmt: skip
        if name == "twins":  # the classifier in two partitions (case2-twins.yaml)
            return PipelineStatus(
                pipeline="twins", status=PipelineState.RUNNING,
                elements=[element("band", "fog-a", [], kind="bandpass"),
                          *(element(f"cls-p{k}", f"fog-{'ab'[k]}", ["band"], kind="classify",
                                    partition_of="cls", partition=k, partitions=2)
                            for k in (0, 1))],
            )  # fmt: skip
        if name != "p":
            raise NotFound(f"no pipeline {name!r}", expected="p", received=name)
        return PipelineStatus(
            pipeline="p", status=PipelineState.RUNNING,
            elements=[element("src", "cloud", [], out=10),
                      element("pick", "fog-a", ["src"], events_in=8, out=6, epoch=3)],
        )  # fmt: skip

    #: What every poll of the nodes fails with (the orchestrator in trouble), if anything.
    unreachable: FogshiftError | None = None
    failed_polls = 0

    def nodes(self) -> list[NodeView]:
        if self.unreachable is not None:
            self.failed_polls += 1
            raise self.unreachable
        stalled = node("fog-b").model_copy(
            update={
                "warnings": ["node-level checkpoints stopped: the last round ended 60 s ago"],
                "disk_free_bytes": 3 * 2**29,
                "disk_total_bytes": 50 * 2**30,
            }
        )
        return [node("cloud"), node("fog-a"), stalled]

    def plan(self) -> PlanView:
        return PlanView(
            unknown_nodes=["fog_a"],
            unplanned={"p/pick": "no backup server"},
            unlinked_nodes=["fog-c"],
            low_disk_nodes=["fog-b"],
        )

    def latency(self, name: str) -> list[HopLatency]:
        return [HopLatency(element="pick", input="src", seq=6, input_seq=8, stored=0.0,
                           latency_ms=345.6)]  # fmt: skip

    #: Why the dead letters cannot be read now (the broker away), if they cannot.
    letters_away: str | None = None
    #: Whose dead letters were read: (pipeline, element).
    letters_read: list[tuple[str, str]]

    def element_errors(self, name: str, element: str, limit: int) -> list[DeadLetter] | str:
        self.letters_read.append((name, element))
        if self.letters_away is not None:
            return self.letters_away
        letters = [DeadLetter(element="pick", seq=4, reason=self.reason, event='{"seq": 4}')]
        return [d for d in letters if d.element == element]

    def operation(self, name: str, element: str) -> OperationView | None:
        return None

    #: Put bodies the ECG view cannot place among the ECG pipeline's events.
    malformed = False

    def events(self, name: str, element: str, key: str | None, tail: int, limit: int) -> EventPage:
        """The ECG pipeline's streams: 30 s of two patients' half-second windows at 4 Hz
        (the band-pass), and one alarm of p02 (the classifier)."""
        self.actions.append(("events", name, element, key))
        if element.startswith("cls-p"):  # p02's twin moved from p0 to p1 at 20 s
            times = {"cls-p0": [12.5, 18.0], "cls-p1": [21.0]}[element]
            bodies = [{"patient": "p02", "t": t, "class": "abnormal", "confidence": t / 100}
                      for t in times]  # fmt: skip
        elif element == "band":
            bodies = [{"patient": who, "t": w / 2, "fs": 4, "samples": [w + 0.0, w + 0.5]}
                      for w in range(60) for who in ("p01", "p02")]  # fmt: skip
            if self.malformed:  # a custom stage's windows the chart cannot place
                odd = [{"t": 0.0, "fs": 0}, {"t": "soon", "fs": 4}, {"t": 1.0, "fs": 10**400}]
                bodies[:0] = [{"patient": "p02", "samples": [1.0], **o} for o in odd]
        else:
            bodies = [{"patient": "p02", "t": 12.5, "class": "abnormal", "confidence": 0.93}]
            if self.malformed:  # alarms a custom classifier emitted without a time
                bodies[:0] = [{"patient": "p02", "t": "12.5", "class": "x"},
                              {"patient": "p02", "t": 10**400, "class": "w"},
                              {"patient": "p02", "class": "y"},
                              {"patient": "p02", "t": float("nan"), "class": "z"},
                              {"patient": "p02", "t": 13.0, "class": "big",
                               "confidence": 10**400}]  # fmt: skip
        chosen = [b for b in bodies if key is None or b["patient"] == key][-tail:]
        return EventPage(
            pipeline=name, element=element, key=key, scanned_after=0, scanned_to=len(bodies),
            last_seq=len(bodies),
            events=[StreamEvent(seq=n, epoch=1, stored=0.0, timestamp=0.0, creator="x", body=b)
                    for n, b in enumerate(chosen, start=1)][-limit:],
        )  # fmt: skip

    def twin_state(self, name: str, element: str, kind: str) -> TwinState | None:
        if element != "pick":
            return None
        twins = [
            TwinEntry(key="p01", state={"zi": [0.5]}),
            TwinEntry(key="p02", state={}),
            TwinEntry(key="p04", state=None, waiting=KeyWaiting(move="m7", events=4)),
        ]
        return TwinState(pipeline=name, element=element, node="fog-a", batch=7,
                         key_by="patient", keys=3, waiting=1, entries=twins)  # fmt: skip

    def migrate(self, name: str, element: str, target: str, mode: str) -> MigrationReport:
        self.actions.append(("migrate", name, element, target, mode))
        if self.refuse:
            raise self.refuse
        return MigrationReport(
            pipeline=name, element=element, origin="fog-a", target=target,
            mode=MigrationMode(mode), status=MigrationStatus.MIGRATED,
            phases_ms={"pause": 12.0, "state": 30.0}, downtime_ms=80.0, epoch=3,
            warnings=["fog-b runs 2 partitions of 'pick' now <b>"],
        )  # fmt: skip

    def migrate_group(
        self, name: str, elements: list[str], target: str, mode: str
    ) -> GroupMigrationReport:
        self.actions.append(("migrate_group", name, elements, target, mode))
        if self.refuse:
            raise self.refuse
        moved = [self.migrate(name, e, target, mode) for e in elements]
        self.actions[-len(elements) :] = []  # one action: the group
        status, undone, error = GroupMigrationStatus.MIGRATED, [], None
        if self.fail_last == "no report":  # the last PE failed before it had a report
            moved = moved[:-1]
            status, error = GroupMigrationStatus.ROLLED_BACK, f"{elements[-1]}: busy"
        elif self.fail_last:
            moved[-1] = moved[-1].model_copy(
                update={
                    "status": MigrationStatus.FAILED,
                    "error": "the target died",
                    "rolled_back": True,
                }
            )
            undone = [m.model_copy(update={"origin": target, "target": "fog-a"})
                      for m in reversed(moved[:-1])]  # fmt: skip
            status, error = GroupMigrationStatus.ROLLED_BACK, f"{elements[-1]}: the target died"
        placement = {e: "fog-a" if status != GroupMigrationStatus.MIGRATED else target
                     for e in elements}  # fmt: skip
        return GroupMigrationReport(
            pipeline=name, elements=elements, target=target, mode=MigrationMode(mode),
            status=status, migrations=moved, undone=undone, error=error, placement=placement,
        )  # fmt: skip

    def restore(self, name: str, element: str, target: str | None) -> RestoreReport:
        self.actions.append(("restore", name, element, target))
        return RestoreReport(pipeline=name, element=element, target=target or "fog-c",
                             status=RestoreStatus.RESTORED, epoch=4)  # fmt: skip

    def stop(self, name: str) -> Any:
        self.actions.append(("stop", name))
        raise AssertionError("not used")

    def start(self, name: str) -> PipelineStatus:
        if self.refuse is not None:
            raise self.refuse
        self.actions.append(("start", name))
        return self.pipeline(name).model_copy(update={"status": PipelineState.RUNNING})

    def delete(self, name: str) -> DeleteResult:
        if self.refuse is not None:
            raise self.refuse
        self.actions.append(("delete", name))
        return DeleteResult(pipeline=name, streams=["a", "b", "c"], nodes=["cloud", "fog-a"],
                            unreachable_nodes=["fog-b"])  # fmt: skip


@pytest.fixture()
def stand_in() -> StandIn:
    return StandIn()


@pytest.fixture()
def sessions() -> Sessions:
    return Sessions(operator_token=TOKEN)


@pytest.fixture()
def web(stand_in: StandIn, sessions: Sessions, tmp_path: Path) -> Iterator[TestClient]:
    app = create_app(stand_in, sessions, DashboardConfig(tmp_path, interval_s=0.05))  # type: ignore[arg-type]
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        yield client


def logged_in(web: TestClient, sessions: Sessions) -> TestClient:
    """Open the login link, then press its page's button (which posts the link's token)."""
    opened = web.get(f"/login?token={sessions.login_token}", follow_redirects=False)
    assert opened.status_code == 200 and "set-cookie" not in opened.headers
    assert f'name="token" value="{sessions.login_token}"' in opened.text
    answer = web.post("/login", data={"token": sessions.login_token}, follow_redirects=False)
    # A page that moves on by itself (same-site, so the SameSite=Strict cookie goes along
    # even when the link was opened from another site), not a redirect.
    assert answer.status_code == 200 and 'url=/pipelines"' in answer.text
    assert answer.headers["referrer-policy"] == "same-origin"
    cookie = answer.headers["set-cookie"]
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie
    assert sessions.login_token not in cookie
    return web


def test_opening_the_link_neither_logs_in_nor_spends_it(
    web: TestClient, sessions: Sessions
) -> None:
    """A link preview, a mail scanner or a prefetch opens a link before its user does: a GET
    that logged in gave it the session and spent the link."""
    for _ in range(2):
        opened = web.get(f"/login?token={sessions.login_token}", follow_redirects=False)
        assert opened.status_code == 200 and "set-cookie" not in opened.headers
        assert "Log in" in opened.text
        assert web.get("/pipelines", follow_redirects=False).status_code == 303
    logged_in(web, sessions)
    assert web.get("/pipelines", follow_redirects=False).status_code == 200


def test_without_a_session_only_the_login_page_answers(web: TestClient, sessions: Sessions) -> None:
    for path in ("/", "/pipelines", "/nodes", "/pipelines/p/elements/pick", "/deploy"):
        answer = web.get(path, follow_redirects=False)
        assert answer.status_code == 303 and answer.headers["location"] == "/login", path
    post = web.post("/pipelines/p/stop", follow_redirects=False)
    assert post.status_code == 303 and post.headers["location"] == "/login"
    live = web.get("/fragments/pipelines", headers={"hx-request": "true"})
    assert live.status_code == 401 and live.headers["hx-redirect"] == "/login"
    assert web.get("/api/pipelines/p/series").status_code == 401
    web.cookies.set(COOKIE, "made-up")
    assert web.get("/pipelines", follow_redirects=False).status_code == 303
    assert "Log in" in web.get("/login").text
    assert web.get("/static/vendor/htmx.min.js").status_code == 200  # assets are local


def test_a_large_or_unmeasured_body_is_refused_before_anything_reads_it(web: TestClient) -> None:
    # The login form is open to all: its file parts were spooled to disk whatever their
    # size (a flood of uploads filled a fog host's disk with no session at all).
    big = web.post("/login", files={"f": ("a", b"x" * (MAX_BODY_BYTES + 1))},
                   data={"token": "x"})  # fmt: skip
    assert big.status_code == 413 and "at most" in big.text
    assert "received: Content-Length" in big.text
    assert big.headers["connection"] == "close"  # not read to its end to keep it open

    def chunks() -> Iterator[bytes]:
        yield b"token=x"

    form = {"content-type": "application/x-www-form-urlencoded"}
    unmeasured = web.post("/login", content=chunks(), headers=form)
    assert unmeasured.status_code == 411 and "Content-Length" in unmeasured.text
    small = web.post("/login", data={"token": "x"}, follow_redirects=False)
    assert small.status_code not in (411, 413)


def _through_limit(headers: list[tuple[bytes, bytes]], body: bytes, most: int) -> tuple:
    """A POST with ``headers`` and ``body`` (in 100-byte messages) through
    :class:`BodyLimit`: the status answered, and the bytes the app behind it read."""
    import asyncio

    from fogshift.web.app import BodyLimit

    read: list[bytes] = []
    sent: list[dict[str, Any]] = []
    parts = [body[i : i + 100] for i in range(0, len(body), 100)] or [b""]
    messages = [{"type": "http.request", "body": part, "more_body": n < len(parts) - 1}
                for n, part in enumerate(parts)]  # fmt: skip

    async def receive() -> dict[str, Any]:
        return messages.pop(0) if messages else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        while True:  # reads as a form parser does, until the body ends or the client goes
            message = await receive()
            if message["type"] != "http.request":
                return
            read.append(message["body"])
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})

    scope = {"type": "http", "method": "POST", "path": "/login", "headers": headers}
    asyncio.run(BodyLimit(app, most)(scope, receive, send))
    status = next(m["status"] for m in sent if m["type"] == "http.response.start") if sent else None
    return status, b"".join(read)


def test_the_session_cookie_is_secure_when_reached_over_tls(
    stand_in: StandIn, sessions: Sessions, tmp_path: Path
) -> None:
    """Behind a TLS proxy the cookie was still sent by the browser over plain HTTP."""
    app = create_app(stand_in, sessions, DashboardConfig(tmp_path, interval_s=0.05))  # type: ignore[arg-type]
    with TestClient(app, base_url="https://127.0.0.1:8765") as client:
        answer = client.post("/login", data={"token": sessions.login_token},
                             follow_redirects=False)  # fmt: skip
        assert answer.status_code == 200 and "Secure" in answer.headers["set-cookie"]
        form = client.post("/login", data={"token": TOKEN}, follow_redirects=False,
                           headers={"origin": "https://127.0.0.1:8765"})  # fmt: skip
        assert "Secure" in form.headers["set-cookie"]
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:
        answer = client.post("/login", data={"token": TOKEN}, follow_redirects=False)
        assert answer.status_code == 200 and "Secure" not in answer.headers["set-cookie"]


def test_behind_a_tls_proxy_on_another_host_the_cookie_is_secure_and_hsts_sent(
    stand_in: StandIn, sessions: Sessions, tmp_path: Path
) -> None:
    """uvicorn takes X-Forwarded-Proto from a proxy on loopback only: behind one on another
    host every request looked like plain HTTP, and the cookie lacked Secure."""
    config = DashboardConfig(tmp_path, interval_s=0.05, tls_proxy=True)
    app = create_app(stand_in, sessions, config)  # type: ignore[arg-type]
    with TestClient(app, base_url="http://127.0.0.1:8765") as client:  # (as the proxy calls)
        answer = client.post("/login", data={"token": TOKEN}, follow_redirects=False)
        assert answer.status_code == 200 and "Secure" in answer.headers["set-cookie"]
        assert answer.headers["strict-transport-security"] == "max-age=31536000"
        refused = client.get("/static/none.css")  # every answer, with or without a session
        assert refused.headers["strict-transport-security"] == "max-age=31536000"
    plain = create_app(stand_in, sessions, DashboardConfig(tmp_path, interval_s=0.05))  # type: ignore[arg-type]
    with TestClient(plain, base_url="http://127.0.0.1:8765") as client:
        answer = client.post("/login", data={"token": TOKEN}, follow_redirects=False)
        assert "Secure" not in answer.headers["set-cookie"]
        assert "strict-transport-security" not in answer.headers


def test_a_chunked_body_is_refused_even_with_a_content_length() -> None:
    """h11 reads a chunked body whatever Content-Length says: a small declared length let
    a login form's file parts of any size be spooled to disk, with no session."""
    chunked = [(b"content-length", b"10"), (b"transfer-encoding", b"chunked")]
    assert _through_limit(chunked, b"x" * 5000, most=1000) == (411, b"")
    # A body longer than its headers said is cut where it passes the limit.
    lying = [(b"content-length", b"10")]
    status, read = _through_limit(lying, b"x" * 5000, most=1000)
    assert status is None and len(read) <= 1000
    assert _through_limit(lying, b"x" * 500, most=1000) == (200, b"x" * 500)


def test_the_link_logs_in_once_and_the_form_takes_the_operator_token(
    web: TestClient, sessions: Sessions
) -> None:
    logged_in(web, sessions)
    assert web.get("/pipelines").status_code == 200
    web.cookies.clear()
    again = web.get(f"/login?token={sessions.login_token}", follow_redirects=False)
    assert again.status_code == 403 and "works once" in again.text
    form = web.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert form.status_code == 200 and COOKIE in form.headers["set-cookie"]
    web.cookies.clear()
    # Never the operator token in a URL (history and logs keep URLs).
    assert web.get(f"/login?token={TOKEN}", follow_redirects=False).status_code == 403


def test_pages_show_the_pipeline_its_pes_and_their_dead_letters(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    logged_in(web, sessions)
    overview = web.get("/pipelines").text
    assert 'data-element="pick" data-node="fog-a"' in overview  # the drawing, from a poll
    pipeline = web.get("/pipelines/p").text
    assert "lag" in pipeline and ">2<" in pipeline  # src emitted 10, pick read 8
    detail = web.get("/pipelines/p/elements/pick").text
    assert "KeyError: &#39;value&#39;" in detail and "<option>fog-b</option>" in detail
    assert "<option>fog-a</option>" not in detail.split('id="target"')[1].split("</select>")[0]
    # Its twins, per key, as of a committed batch.
    assert (
        "Its state per patient (3 keys, 1 waiting for a key move's state, 3 shown), as of "
        "batch 7 on fog-a" in detail
    )
    assert '<th scope="row">p01</th><td><code>{"zi": [0.5]}</code>' in detail
    # A key moving in, its state not come yet: what it waits for, not an empty state.
    assert (
        '<th scope="row">p04</th><td>moving in: waiting for key move m7\'s state '
        "(4 events held)</td>" in detail
    )
    assert web.get("/pipelines/p/elements/nope").status_code == 404
    assert web.get("/pipelines/..%2Fx").status_code in (404, 422)
    # Its own dead letters read (not every PE's, then filtered); the broker away fails
    # that part only, not the page with its restore form.
    assert stand_in.letters_read == [("p", "pick")]
    stand_in.letters_away = "the broker does not answer"
    away = web.get("/pipelines/p/elements/pick")
    assert away.status_code == 200
    assert "Cannot be read now: the broker does not answer" in away.text
    nodes = web.get("/nodes")
    assert nodes.status_code == 200
    row = nodes.text.split('data-node="fog-b"')[1].split("</tr>")[0]
    assert "node-level checkpoints stopped: the last round ended 60 s ago" in row
    assert "1.5 of 50 GiB free" in row and "when last heard" not in row
    # A name in the fog topology that no node has (a typo) is told, not silently dropped.
    assert "The fog topology names fog_a, which no node of the cluster is" in nodes.text
    assert "Planner: p/pick has no plan: no backup server" in nodes.text  # (it had none)
    assert "links name no link of fog-c" in nodes.text
    assert "The disk of fog-b is nearly full: the plan puts no backup" in nodes.text
    assert (
        '<td class="num">\N{EN DASH}</td>'
        in nodes.text.split('data-node="cloud"')[1].split("</tr>")[0]
    )


def test_the_pages_live_parts_follow_what_changes_and_leave_the_forms_alone(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    # A walk-through's finding: after a migration, the pipeline page's move form still
    # said "pick on fog-a", and the PE's page and the nodes page never refreshed at all.
    logged_in(web, sessions)
    pipeline = web.get("/pipelines/p").text
    assert '<span id="on-pick" class="muted">on fog-a</span>' in pipeline
    assert "hx-swap-oob" not in pipeline  # (the page itself: one element of each id)
    moved = stand_in.pipeline("p")
    moved = moved.model_copy(update={"elements": [moved.elements[0],
                                                  moved.elements[1].model_copy(
                                                      update={"node": "fog-b"})]})  # fmt: skip
    stand_in.pipeline = lambda name: moved  # type: ignore[method-assign]
    live = web.get("/fragments/pipelines/p", headers={"hx-request": "true"}).text
    assert '<span id="on-pick" class="muted" hx-swap-oob="true">on fog-b</span>' in live
    assert "<form" not in live  # the form as the user filled it
    # What the page shows around its live part (its state, its actions, the PEs the move
    # form lists) is drawn again once it changed, not before: a stopped pipeline's page
    # said "running" and offered "Stop" for good.
    shape = re.search(r'hx-get="/fragments/pipelines/p\?shape=([0-9a-f]+)"', pipeline)
    assert shape is not None
    asked = f"/fragments/pipelines/p?shape={shape.group(1)}"
    assert "hx-refresh" not in web.get(asked, headers={"hx-request": "true"}).headers
    stopped = moved.model_copy(update={"status": PipelineState.STOPPED})
    stand_in.pipeline = lambda name: stopped  # type: ignore[method-assign]
    assert web.get(asked, headers={"hx-request": "true"}).headers["hx-refresh"] == "true"
    assert web.get("/fragments/pipelines/p?shape=x%3Cb").status_code == 422
    # The PE's page: its facts and operations in a live part; its state and dead letters
    # (read from its node and the broker) in another, polled slowly.
    detail = web.get("/pipelines/p/elements/pick").text
    assert 'hx-get="/fragments/pipelines/p/elements/pick"' in detail
    assert 'hx-get="/fragments/pipelines/p/elements/pick/more" hx-trigger="every 15s"' in detail
    part = web.get("/fragments/pipelines/p/elements/pick", headers={"hx-request": "true"}).text
    assert '<dd class="node">fog-b</dd>' in part and "<form" not in part
    assert "Last operation" in part and "Its state" not in part and "KeyError" not in part
    more = web.get("/fragments/pipelines/p/elements/pick/more").text
    assert "KeyError: &#39;value&#39;" in more and "Its state per patient" in more
    assert "<form" not in more
    for bad in (
        "/fragments/pipelines/p/elements/nope",
        "/fragments/pipelines/p/elements/nope/more",
    ):
        assert web.get(bad).status_code == 404, bad
    # The nodes page: its table live.
    assert 'hx-get="/fragments/nodes"' in web.get("/nodes").text
    nodes = web.get("/fragments/nodes", headers={"hx-request": "true"}).text
    assert 'data-node="fog-b"' in nodes and "<h1>" not in nodes


def test_an_action_asks_first_then_shows_its_report(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    logged_in(web, sessions)
    url = "/pipelines/p/elements/pick/migrate"
    ask = web.post(url, data={"target": "fog-b", "mode": "literal"})
    assert ask.status_code == 200 and "from fog-a to fog-b (literal)?" in ask.text
    assert stand_in.actions == []  # nothing happens before the confirmation
    posted = web.post(
        url, data={"target": "fog-b", "mode": "literal", "confirmed": "true"},
        follow_redirects=False,
    )  # fmt: skip
    assert posted.status_code == 303 and posted.headers["location"].startswith("/results/")
    done = web.get(posted.headers["location"])
    assert done.status_code == 200 and "Migrated." in done.text and "80 ms" in done.text
    # Its warnings too (the CLI printed them; the page did not), as text.
    assert "fog-b runs 2 partitions of &#39;pick&#39; now &lt;b&gt;" in done.text
    assert web.get(posted.headers["location"]).text == done.text  # a reload shows it again
    assert stand_in.actions == [("migrate", "p", "pick", "fog-b", "literal")]  # ... only
    restored = web.post("/pipelines/p/elements/pick/restore",
                        data={"target": "", "confirmed": "true"})  # fmt: skip
    assert "Restored." in restored.text and "on fog-c" in restored.text
    assert stand_in.actions[-1] == ("restore", "p", "pick", None)
    # The confirmation says what the restore does: a PE with a hot standby has it promoted
    # (it said "from its central checkpoint" whatever the PE had).
    ask = web.post("/pipelines/p/elements/pick/restore", data={"target": ""})
    assert "from its central checkpoint on the best healthy node?" in ask.text
    real = stand_in.pipeline

    def with_standby(name: str) -> PipelineStatus:
        status = real(name)
        standby = StandbyStatus(node="fog-b", epoch=4, state="running")
        return status.model_copy(update={"elements": [
            e.model_copy(update={"standby": standby}) if e.element == "pick" else e
            for e in status.elements]})  # fmt: skip

    stand_in.pipeline = with_standby  # type: ignore[method-assign]
    ask = web.post("/pipelines/p/elements/pick/restore", data={"target": ""})
    assert "by promoting its hot standby on fog-b?" in ask.text, ask.text
    ask = web.post("/pipelines/p/elements/pick/restore", data={"target": "fog-c"})
    assert "from its central checkpoint on fog-c?" in ask.text
    assert "takes over" in web.get("/pipelines/p/elements/pick").text


def test_a_running_pipelines_page_shows_its_warnings(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    logged_in(web, sessions)
    warned = stand_in.pipeline("p").model_copy(update={"warnings": ["fog-a runs 2 <parts>"]})
    stand_in.pipeline = lambda name: warned  # type: ignore[method-assign]
    page = web.get("/pipelines/p").text
    assert '<p class="errtext warning">fog-a runs 2 &lt;parts&gt;</p>' in page


def test_a_stopped_pipeline_is_started_again_from_its_page(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    logged_in(web, sessions)
    stopped = stand_in.pipeline("p").model_copy(update={"status": PipelineState.STOPPED})
    stand_in.pipeline = lambda name: stopped  # type: ignore[method-assign]
    page = web.get("/pipelines/p").text
    assert "Start again where it stopped" in page and "Delete pipeline…" in page
    done = web.post("/pipelines/p/start")
    assert stand_in.actions == [("start", "p")]
    assert "Started p again where it stopped: its PEs running." in done.text, done.text
    stand_in.refuse = Conflict(
        "cannot start pipeline 'p': it is running",
        expected="a stopped pipeline (`fogshift stop`)",
        received="running",
        hint="it runs already: `fogshift status p`",
    )
    refused = html.unescape(web.post("/pipelines/p/start").text)
    assert "it is running" in refused and "it runs already" in refused
    # A failed one is not offered it (nothing to go on from: deployed again instead).
    failed = stopped.model_copy(update={"status": PipelineState.FAILED})
    stand_in.pipeline = lambda name: failed  # type: ignore[method-assign]
    assert "Start again" not in web.get("/pipelines/p").text


def test_a_failed_pipelines_page_says_why(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    logged_in(web, sessions)
    failed = stand_in.pipeline("p").model_copy(
        update={"status": PipelineState.FAILED, "error": "a PE could not be started: <gone>"}
    )
    stand_in.pipeline = lambda name: failed  # type: ignore[method-assign]
    page = web.get("/pipelines/p").text
    assert "Why it failed: a PE could not be started: &lt;gone&gt;" in page
    assert 'class="errtext warning"' not in page  # (a running pipeline's warnings, below)
    # A failed (or stopped) pipeline is deleted from its page, not stopped; confirmed first.
    assert "Delete pipeline…" in page and "Stop pipeline…" not in page
    # Nor are its PEs offered to move (refused while it does not run).
    assert "Migrate selected…" not in page and "p is failed: its PEs move" in page
    pe_page = web.get("/pipelines/p/elements/pick").text
    assert "Migrate…" not in pe_page and "Restore…" not in pe_page
    assert 'id="on-pick"' not in web.get("/fragments/pipelines/p").text
    ask = web.post("/pipelines/p/delete")
    assert "go for good; its output files stay" in ask.text and stand_in.actions == []
    done = web.post("/pipelines/p/delete", data={"confirmed": "true"})
    assert stand_in.actions == [("delete", "p")]
    assert "Deleted p: 3 streams, checkpoints on cloud, fog-a." in done.text
    assert "Unreachable nodes (what they hold of it goes once they are heard again): fog-b" in (
        done.text
    )
    stand_in.refuse = Conflict(
        "cannot delete pipeline 'p': it is running",
        expected="a stopped or failed pipeline",
        received="running",
    )
    refused = html.unescape(web.post("/pipelines/p/delete", data={"confirmed": "true"}).text)
    assert "it is running" in refused and "a stopped or failed pipeline" in refused


def test_an_address_that_names_nothing_is_not_said_to_be_a_refused_action(
    web: TestClient, sessions: Sessions
) -> None:
    # A walk-through's finding: /pipelines/café showed the name's regular expression and
    # "go back … send its form again", and an unknown pipeline's page "Refused: nothing was
    # changed, the pipelines run on".
    logged_in(web, sessions)
    bad = web.get("/pipelines/caf\u00e9")
    assert bad.status_code == 422
    text = html.unescape(bad.text)
    assert "'café' cannot be used as a name" in text and "pattern" not in text
    assert "check the address" in text and "send its form again" not in text
    assert "This page cannot be shown" in text
    unknown = html.unescape(web.get("/pipelines/nope").text)
    assert "This page cannot be shown" in unknown and "pipelines run on" not in unknown


def test_a_failed_migration_shows_its_report_and_where_the_pe_runs(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    logged_in(web, sessions)
    report = stand_in.migrate("p", "pick", "fog-b", "precopy").model_copy(
        update={"status": MigrationStatus.FAILED, "rolled_back": True, "epoch": 4,
                "error": "the target died"}
    )  # fmt: skip
    failure = MigrationFailed("migration of p/pick from fog-a to fog-b failed")
    failure.report = report
    stand_in.refuse = failure
    answer = web.post("/pipelines/p/elements/pick/migrate",
                      data={"target": "fog-b", "mode": "precopy", "confirmed": "true"})  # fmt: skip
    assert answer.status_code == 502
    assert "rolled back: pick runs on fog-a again (epoch 4)" in answer.text
    assert "the target died" in answer.text and "Migrated." not in answer.text


def test_a_refusal_shows_what_was_expected_received_and_a_hint(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    logged_in(web, sessions)
    stand_in.refuse = InvalidInput(
        "p/pick already runs on node 'fog-a': cannot migrate it there",
        expected="a node other than 'fog-a'", received="'fog-a'", hint="choose another node",
    )  # fmt: skip
    url = "/pipelines/p/elements/pick/migrate"
    answer = web.post(url, data={"target": "fog-a", "mode": "literal", "confirmed": "true"})
    assert answer.status_code == 422
    for text in ("already runs on node", "expected", "a node other than", "hint",
                 "choose another node", "nothing was changed"):  # fmt: skip
        assert text in answer.text.replace("&#39;", "'"), text
    bad_mode = web.post(url, data={"target": "fog-b", "mode": "teleport"})
    assert bad_mode.status_code == 422 and "precopy or literal" in bad_mode.text


def test_an_unhealthy_target_is_a_refusal_and_only_no_answer_may_still_be_running(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    # The orchestrator refuses a node it has not heard from as `unavailable`, before it
    # starts anything: the page said "the operation may still be running".
    logged_in(web, sessions)
    url = "/pipelines/p/elements/pick/migrate"
    form = {"target": "fog-b", "mode": "precopy", "confirmed": "true"}
    stand_in.refuse = Unavailable(
        "cannot migrate p/pick to node 'fog-b': it is not healthy",
        expected="a node heard within 5 s", received="'fog-b' last heard 8 s ago",
        hint="choose another node",
    )  # fmt: skip
    refused = web.post(url, data=form)
    assert refused.status_code == 503
    text = refused.text.replace("&#39;", "'")
    assert "Refused: a node, the broker or the orchestrator it needs cannot be reached" in text
    assert "may still be running" not in text
    assert "it is not healthy" in text and "last heard 8 s ago" in text
    stand_in.refuse = NoAnswer("the orchestrator at http://127.0.0.1:1 took the request and "
                               "did not answer in time (ReadTimeout)")  # fmt: skip
    unanswered = web.post(url, data=form)
    assert unanswered.status_code == 503
    assert "No answer in time: the operation may still be running" in unanswered.text
    assert "nothing was changed" not in unanswered.text


def test_a_post_from_another_site_is_refused(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    logged_in(web, sessions)
    answer = web.post(
        "/pipelines/p/elements/pick/migrate",
        data={"target": "fog-b", "mode": "literal", "confirmed": "true"},
        headers={"origin": "http://evil.example"},
    )
    assert answer.status_code == 403 and stand_in.actions == []
    no_origin = web.post(
        "/pipelines/p/elements/pick/migrate",
        data={"target": "fog-b", "mode": "literal", "confirmed": "true"},
        headers={"sec-fetch-site": "cross-site"},
    )
    assert no_origin.status_code == 403 and stand_in.actions == []
    # A name of another site that resolves to this machine (DNS rebinding) is not served.
    assert web.get("/pipelines", headers={"host": "evil.example:8765"}).status_code == 400


def test_a_bad_port_in_an_origin_is_refused_not_a_failure(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    logged_in(web, sessions)
    for origin in ("https://127.0.0.1:99999", "https://127.0.0.1:port"):
        answer = web.post("/pipelines/p/stop", headers={"origin": origin})
        assert answer.status_code == 403 and "another site" in answer.text, origin
    assert stand_in.actions == []


def test_a_page_without_a_session_shows_neither_the_orchestrators_troubles_nor_the_menu(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    """Refusals answered without a session (a missing file under /static, a wrong method on
    /login) showed anyone who could reach the port what the orchestrator's last poll failed
    with (its address among it), and the menu."""
    stand_in.unreachable = FogshiftError("orchestrator at http://10.1.2.3:7443 unreachable")
    # (The second failed poll began after the first had kept its error.)
    wait_until(lambda: stand_in.failed_polls >= 2, 10, describe="two failed polls")
    for answer in (web.get("/static/none.css"), web.put("/login"), web.get("/login")):
        assert answer.status_code in (200, 404, 405), answer.status_code
        assert "10.1.2.3" not in answer.text and "Log out" not in answer.text
    logged_in(web, sessions)
    page = web.get("/pipelines")
    assert "10.1.2.3" in page.text and "does not answer" in page.text and "Log out" in page.text


def test_what_the_orchestrator_says_is_escaped(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    logged_in(web, sessions)
    stand_in.reason = "<script>alert(1)</script>"
    page = web.get("/pipelines/p/elements/pick").text
    assert "<script>alert(1)" not in page and "&lt;script&gt;alert(1)" in page


def test_the_sampler_outlives_a_bug_in_a_poll() -> None:
    calls: list[int] = []

    def fetch() -> tuple[list[PipelineStatus], list[NodeView]]:
        calls.append(1)
        if len(calls) == 1:
            raise TypeError("not a list")
        return [], [node("cloud")]

    history = History()
    sampler = Sampler(history, fetch, interval_s=0.01)
    sampler.start()
    try:
        wait_until(lambda: history.latest, 10, describe="a poll after the failed one")
    finally:
        sampler.close()
    assert sampler.error is None and len(calls) >= 2


def test_deploy_checks_the_spec_before_asking(web: TestClient, sessions: Sessions) -> None:
    logged_in(web, sessions)
    empty = web.post("/deploy", data={"spec_text": ""})
    assert empty.status_code == 422 and "no pipeline spec" in empty.text
    typo = "pipeline: q\nelements:\n  - {id: s, kind: csv-sourse, node: cloud}\n"
    refused = web.post("/deploy", files={"spec_file": ("q.yaml", typo.encode())})
    assert refused.status_code == 422 and "csv-source" in refused.text  # did you mean


def test_a_large_spec_is_confirmed_as_multipart_and_deployed(
    web: TestClient, sessions: Sessions, stand_in: StandIn, tmp_path: Path
) -> None:
    """The confirmation posted the spec's text URL-encoded: a line end took 6 bytes (a
    browser sends CR LF), and a spec well under its limit came back over the body's (a bare
    413 instead of the deploy)."""
    logged_in(web, sessions)
    (tmp_path / "in.csv").write_text("timestamp,sensor,value\n")
    spec = (
        "pipeline: big\nelements:\n"
        "  - {id: s, kind: csv-source, node: cloud, options: {path: in.csv}}\n"
        "  - {id: o, kind: csv-sink, node: cloud, inputs: [s], options: {path: out/o.csv}}\n"
    )
    spec += "#\n" * ((MAX_SPEC_BYTES - len(spec)) // 2 - 10)  # comments up to the limit
    asked = web.post("/deploy", files={"spec_file": ("big.yaml", spec.encode())})
    assert asked.status_code == 200 and "Deploy big?" in asked.text
    assert 'enctype="multipart/form-data"' in asked.text
    deployed: list[str] = []
    stand_in.deploy = lambda body, fresh: deployed.append(body["pipeline"]) or {}  # type: ignore[attr-defined]
    as_sent = {"spec_text": spec.replace("\n", "\r\n"), "confirmed": "true"}  # a browser's
    urlencoded = web.post("/deploy", data=as_sent)
    assert urlencoded.status_code == 413  # what the form sent before
    multipart = web.post("/deploy", files={k: (None, v) for k, v in as_sent.items()},
                         follow_redirects=False)  # fmt: skip
    assert multipart.status_code == 303 and deployed == ["big"], multipart.text


def test_deploying_the_name_of_a_stopped_pipeline_says_it_starts_over(
    web: TestClient, sessions: Sessions, stand_in: StandIn, tmp_path: Path
) -> None:
    """The orchestrator refuses to start a kept run over unasked; the confirmation says
    what a deploy empties and asks it (``fresh``), and only of a stopped pipeline."""
    logged_in(web, sessions)
    (tmp_path / "in.csv").write_text("timestamp,sensor,value\n")
    spec = (
        "pipeline: p\nelements:\n"
        "  - {id: s, kind: csv-source, node: cloud, options: {path: in.csv}}\n"
        "  - {id: o, kind: csv-sink, node: cloud, inputs: [s], options: {path: out/o.csv}}\n"
    )
    calls: list[tuple[str, bool]] = []
    stand_in.deploy = lambda body, fresh: calls.append((body["pipeline"], fresh)) or {}  # type: ignore[attr-defined]

    def confirmation() -> str:
        return html.unescape(web.post("/deploy", data={"spec_text": spec}).text)

    assert "starts over" not in confirmation()  # p runs: the orchestrator refuses it
    stopped = stand_in.pipeline("p").model_copy(update={"status": PipelineState.STOPPED})
    stand_in.pipeline = lambda name: stopped  # type: ignore[method-assign]
    asked = confirmation()
    assert "Pipeline p is stopped, its output kept: deployed again, it starts over" in asked
    assert '<input type="hidden" name="fresh" value="true">' in asked
    web.post("/deploy", data={"spec_text": spec, "fresh": "true", "confirmed": "true"})
    web.post("/deploy", data={"spec_text": spec, "confirmed": "true"})
    assert calls == [("p", True), ("p", False)]


def test_several_pes_migrate_as_one_operation_after_one_confirmation(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    logged_in(web, sessions)
    overview = web.get("/pipelines/p")
    assert 'name="elements" value="src"' in overview.text
    assert 'name="elements" value="pick"' in overview.text
    form = {"elements": ["pick", "src"], "target": "fog-b", "mode": "precopy"}
    ask = web.post("/pipelines/p/migrate", data=form)
    assert ask.status_code == 200
    assert "pick (on fog-a), src (on cloud) of p to fog-b (precopy) as one operation" in ask.text
    # The confirmation carries every PE, in order.
    assert ask.text.index('value="pick"') < ask.text.index('value="src"')
    assert stand_in.actions == []
    posted = web.post("/pipelines/p/migrate", data={**form, "confirmed": "true"},
                      follow_redirects=False)  # fmt: skip
    assert posted.status_code == 303
    done = web.get(posted.headers["location"])
    assert done.status_code == 200 and "Migrated 2 of 2 to fog-b." in done.text
    # One request to the orchestrator's group endpoint, the PEs in the order ticked.
    assert stand_in.actions == [("migrate_group", "p", ["pick", "src"], "fog-b", "precopy")]


def test_a_group_whose_last_pe_fails_shows_the_moves_back(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    logged_in(web, sessions)
    stand_in.fail_last = True
    answer = web.post("/pipelines/p/migrate", data={
        "elements": ["pick", "src"], "target": "fog-b", "mode": "literal", "confirmed": "true",
    })  # fmt: skip
    text = answer.text.replace("&#39;", "'")
    assert "Rolled back: src could not move" in text and "src: the target died" in text
    assert "pick, moved back" in text and "Migration fog-b → fog-a" in text
    # Where each runs now: back where they were.
    assert '<th scope="row">pick</th><td class="node">fog-a</td>' in text
    # A PE that failed before its migration had a report: the page named the last PE that
    # moved (pick), or answered 500 when none had.
    stand_in.fail_last = "no report"
    for elements in (["pick", "src"], ["src"]):
        answer = web.post("/pipelines/p/migrate", data={
            "elements": elements, "target": "fog-b", "mode": "literal", "confirmed": "true",
        })  # fmt: skip
        assert answer.status_code == 200, answer.text
        assert "Rolled back: src could not move" in answer.text.replace("&#39;", "'")


def test_a_group_partly_on_its_target_moves_the_rest(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    # The same group again finishes one an orchestrator died in: it was refused whole.
    logged_in(web, sessions)
    form = {"elements": ["pick", "src"], "target": "cloud", "mode": "literal"}
    asked = web.post("/pipelines/p/migrate", data=form)
    assert asked.status_code == 200 and stand_in.actions == []
    text = asked.text.replace("&#39;", "'")
    assert "Migrate pick (on fog-a) of p to cloud (literal) as one operation (src there" in text
    done = web.post("/pipelines/p/migrate", data={**form, "confirmed": "true"})
    assert done.status_code == 200
    assert stand_in.actions == [("migrate_group", "p", ["pick", "src"], "cloud", "literal")]


def test_a_refused_group_changes_nothing_and_says_why(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    logged_in(web, sessions)
    stand_in.refuse = InvalidInput(
        "node 'fog-b' is not healthy", expected="a healthy node", received="fog-b",
        hint="see the nodes page",
    )  # fmt: skip
    answer = web.post("/pipelines/p/migrate", data={
        "elements": ["pick", "src"], "target": "fog-b", "mode": "literal", "confirmed": "true",
    })  # fmt: skip
    assert answer.status_code == 422
    text = answer.text.replace("&#39;", "'")
    assert "Refused: nothing was changed" in text
    assert "node 'fog-b' is not healthy" in text and "see the nodes page" in text
    assert stand_in.actions == [("migrate_group", "p", ["pick", "src"], "fog-b", "literal")]


@pytest.mark.parametrize(
    ("form", "words"),
    [
        ({"target": "fog-b"}, "tick the PEs to move"),
        ({"elements": ["pick", "nope"], "target": "fog-b"}, "has no element 'nope'"),
        ({"elements": ["pick"], "target": ""}, "no target node"),
        ({"elements": ["pick"], "target": "fog-b", "mode": "teleport"}, "precopy or literal"),
        ({"elements": ["src"], "target": "cloud"}, "untick them"),
    ],
)
def test_several_pes_refused_before_anything_moves(
    web: TestClient, sessions: Sessions, stand_in: StandIn, form: dict[str, Any], words: str
) -> None:
    logged_in(web, sessions)
    answer = web.post("/pipelines/p/migrate", data={**form, "confirmed": "true"})
    assert answer.status_code == 422
    assert words in answer.text.replace("&#39;", "'")
    assert stand_in.actions == []


def test_the_ecg_view_draws_a_patients_newest_signal_and_lists_their_alarms(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    logged_in(web, sessions)
    assert "/pipelines/ecg/ecg" in web.get("/pipelines/ecg").text  # linked from the pipeline
    view = web.get("/pipelines/ecg/ecg")
    assert view.status_code == 200
    # Every patient is a link; the first is shown.
    assert 'href="/pipelines/ecg/ecg?patient=p02"' in view.text
    assert "ECG of p01" in view.text and "No alarm for p01" in view.text
    chosen = web.get("/pipelines/ecg/ecg", params={"patient": "p02"})
    assert "<td>abnormal</td>" in chosen.text and "0.93" in chosen.text
    series = web.get("/api/pipelines/ecg/ecg", params={"patient": "p02"}).json()
    # The last 10 s of p02's recording, each sample at its own time, the alarm marked.
    assert series["t"][0] == 19.75 and series["t"][-1] == 29.75
    assert series["y"][:2] == [39.5, 40.0] and len(series["t"]) == len(series["y"]) == 41
    assert series["marks"] == [{"t": 12.5, "kind": "abnormal", "text": "abnormal"}]
    # Only that patient's windows and alarms were asked for.
    assert ("events", "ecg", "band", "p02") in stand_in.actions
    assert ("events", "ecg", "cls", "p02") in stand_in.actions
    # Bodies it cannot place (a text or no time, a zero rate) are left out: before, the page,
    # its alarm fragment and the chart's series each failed with a 500.
    stand_in.malformed = True
    again = web.get("/pipelines/ecg/ecg", params={"patient": "p02"})
    assert again.status_code == 200 and "<td>abnormal</td>" in again.text
    assert "<td>x</td>" not in again.text and "<td>y</td>" not in again.text
    # A confidence beyond a float's range is shown as none (formatting it failed with a 500).
    assert '<td>big</td><td class="num">\u2013</td>' in again.text
    fragment = web.get("/fragments/pipelines/ecg/ecg", params={"patient": "p02"})
    assert fragment.status_code == 200, fragment.text
    placed = web.get("/api/pipelines/ecg/ecg", params={"patient": "p02"}).json()
    assert [m["kind"] for m in placed.pop("marks")] == ["big", "abnormal"]  # (its t is one)
    assert placed == {k: v for k, v in series.items() if k != "marks"}
    stand_in.malformed = False
    # A classifier in partitions: each patient's alarms from every partition, in time order
    # (before, the last partition's only: p02's alarms before its twin moved were missing).
    twins = web.get("/api/pipelines/twins/ecg", params={"patient": "p02"}).json()
    assert [m["t"] for m in twins["marks"]] == [12.5, 18.0, 21.0]
    page = web.get("/pipelines/twins/ecg", params={"patient": "p02"})
    assert page.status_code == 200 and page.text.count("<td>abnormal</td>") == 3
    assert "cls-p0, cls-p1" in page.text
    # A pipeline without an ECG is refused with what the view needs.
    refused = web.get("/pipelines/p/ecg")
    assert refused.status_code == 404 and "a bandpass element" in refused.text


def test_each_pes_newest_per_hop_latency_is_shown_and_charted(
    web: TestClient, sessions: Sessions
) -> None:
    logged_in(web, sessions)
    page = wait_until(lambda: (p := web.get("/pipelines/p")) and "346 ms" in p.text and p, 10,
                      interval_s=0.05, describe="the latency on the pipeline page")  # fmt: skip
    assert '<td class="num latency">346 ms</td>' in page.text
    assert 'data-field="latency"' in page.text
    series = web.get("/api/pipelines/p/series").json()
    assert 345.6 in series["latency"]["pick"]
    assert "346 ms" in web.get("/pipelines/p/elements/pick").text


def test_a_failed_standby_promotion_shows_on_the_pes_page(
    web: TestClient, sessions: Sessions, stand_in: StandIn, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its report has no `live_ms` (only a promotion that took over has): the PE's page was
    # an error page until the PE's next restore.
    failed = RestoreReport(pipeline="p", element="pick", target="fog-b",
                           status=RestoreStatus.FAILED, method="standby",
                           error="the standby's node does not answer")  # fmt: skip
    placed = stand_in.pipeline("p")
    elements = [e.model_copy(update={"last_restore": failed}) if e.element == "pick" else e
                for e in placed.elements]  # fmt: skip
    monkeypatch.setattr(stand_in, "pipeline",
                        lambda name: placed.model_copy(update={"elements": elements}))  # fmt: skip
    logged_in(web, sessions)
    page = web.get("/pipelines/p/elements/pick")
    assert page.status_code == 200, page.text
    assert "its hot standby did not take over" in page.text
    assert "the standby&#39;s node does not answer" in page.text


def test_actions_wait_as_long_as_the_clis_operations_reads_do_not() -> None:
    """A group migration on a loaded node outlived the client's 120 s: the page said "no
    answer in time" while the operation went on."""
    from fogshift.supervisor.cluster import OPERATION_TIMEOUT_S
    from fogshift.web.app import Orchestrator

    asked: list[tuple[str, str, Any]] = []

    class Recording:
        def call(self, model: type, method: str, path: str, **kwargs: Any) -> Any:
            asked.append((method, path, kwargs.get("timeout")))
            raise NotFound("recorded", expected="-", received="-")

    orchestrator = Orchestrator(Recording())  # type: ignore[arg-type]
    for action in (
        lambda: orchestrator.migrate("p", "pick", "fog-b", "precopy"),
        lambda: orchestrator.migrate_group("p", ["pick"], "fog-b", "precopy"),
        lambda: orchestrator.restore("p", "pick", None),
        lambda: orchestrator.stop("p"),
        lambda: orchestrator.deploy({"pipeline": "p"}),
        lambda: orchestrator.pipeline("p"),
    ):
        with pytest.raises(NotFound):
            action()
    assert [t for m, _, t in asked if m == "POST"] == [OPERATION_TIMEOUT_S] * 5
    assert [t for m, _, t in asked if m == "GET"] == [None]


def test_a_page_or_method_it_does_not_have_is_refused_as_any_request(
    web: TestClient, sessions: Sessions
) -> None:
    # Starlette's bare {"detail": ...} before: no expected, received or hint.
    logged_in(web, sessions)
    missing = web.get("/nope")
    assert missing.status_code == 404 and "has no page GET /nope" in missing.text
    assert "the overview (/) links every page" in missing.text
    wrong = web.get("/pipelines/p/stop")
    assert wrong.status_code == 405 and "takes another method" in wrong.text
    assert wrong.headers["allow"] == "POST"
    assert "use the dashboard&#39;s links and buttons" in wrong.text
    unreadable = web.post("/deploy", content=b"x",
                          headers={"content-type": "multipart/form-data"})  # fmt: skip
    assert unreadable.status_code == 400 and "<h1" in unreadable.text, unreadable.text
    assert web.get("/api/nope").json()["code"] == "not_found"


def test_dashboards_on_two_ports_keep_a_cookie_each(
    stand_in: StandIn, sessions: Sessions, tmp_path: Path
) -> None:
    # Browsers keep cookies per host, not per port: the second dashboard's login replaced
    # the first's session, whose login link was spent by then.
    app = create_app(stand_in, sessions, DashboardConfig(tmp_path, interval_s=0.05))  # type: ignore[arg-type]
    other = Sessions(operator_token=TOKEN)
    second = create_app(stand_in, other, DashboardConfig(tmp_path, interval_s=0.05))  # type: ignore[arg-type]
    with (
        TestClient(app, base_url="http://127.0.0.1:8765") as first,
        TestClient(second, base_url="http://127.0.0.1:8766") as then,
    ):
        logged_in(first, sessions)
        logged_in(then, other)
        both = {**dict(first.cookies), **dict(then.cookies)}
        assert sorted(both) == ["fogshift_session_8765", "fogshift_session_8766"]
        first.cookies.update(both)  # what a browser sends to 127.0.0.1, whatever the port
        assert first.get("/pipelines", follow_redirects=False).status_code == 200


def test_a_login_again_ends_the_session_the_browser_had(
    web: TestClient, sessions: Sessions
) -> None:
    # Logging in again (a cookie thought leaked) left the old session valid for 12 h.
    logged_in(web, sessions)
    old = web.cookies.get(cookie_name(8765))
    assert old and sessions.valid(old)
    again = web.post("/login", data={"token": TOKEN}, follow_redirects=False)
    assert again.status_code == 200
    new = web.cookies.get(cookie_name(8765))
    assert new and new != old and sessions.valid(new)
    assert not sessions.valid(old)


def test_times_are_written_in_utc_for_the_browser_to_show_in_its_own_zone(
    web: TestClient, sessions: Sessions, stand_in: StandIn
) -> None:
    # The timeline and the journal said the dashboard server's local time, with no zone,
    # beside charts drawn in the browser's.
    from fogshift.contracts import OperationKind

    logged_in(web, sessions)
    started = 1_796_684_400.0  # 2026-12-07 23:00:00 UTC
    entry = OperationView(id="op1", kind=OperationKind.MIGRATION, pipeline="p", element="pick",
                          origin="fog-a", target="fog-b", epoch=3, phase="done",
                          started=started, updated=started, outcome="migrated",
                          running=False)  # fmt: skip
    stand_in.operation = lambda name, element: entry  # type: ignore[method-assign]
    page = web.get("/pipelines/p/elements/pick").text
    assert '<time datetime="2026-12-07T23:00:00Z">23:00:00 UTC</time>' in page
