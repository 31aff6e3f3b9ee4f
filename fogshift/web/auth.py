"""Login and sessions of the dashboard.

`fogshift dashboard` prints a login URL carrying a one-time token (as Jupyter does): it opens
a page whose button posts the token, which gets a session cookie and spends it (opening the
link alone does neither: link previews, mail scanners and prefetching open links before
their users do); unused, it expires after
``link_s`` (10 minutes) or at the first login by the operator token, so a link left in a
log or a terminal's scrollback logs nobody in later. The operator token (the one in
``<home>/token``, which the CLI uses) also logs in, through the login form, for a browser that
lost its cookie. Later requests carry only the cookie: ``HttpOnly`` (no script reads it) and
``SameSite=Strict`` (no other site's page sends it); state-changing requests must also come
from the dashboard's own origin. A session ends at logout, after 12 hours unused, and 12
hours after its login whatever its use.
"""

from __future__ import annotations

import secrets
import threading
import time
from dataclasses import dataclass, field

from fogshift.common.http import same_token
from fogshift.web.exceptions import BadLogin

#: The session cookie's name (with the port: see :func:`cookie_name`).
COOKIE = "fogshift_session"


def cookie_name(port: int | None) -> str:
    """The session cookie's name for a dashboard reached on ``port`` (``None``: the
    scheme's default). Browsers keep cookies per host, not per port: two dashboards on one
    machine (two clusters) logged each other out, and the first's login link was spent."""
    return COOKIE if port is None else f"{COOKIE}_{port}"


@dataclass
class Sessions:
    """The one-time login token and the live sessions of one dashboard process.

    Args:
        operator_token: The cluster's operator token (also accepted by the login form).
        idle_s: A session unused for this long ends.
        lifetime_s: A session ends this long after its login, used or not: an open page's
            live parts use it every few seconds, so the idle bound alone never ended a
            forgotten tab's session, nor a stolen cookie kept in use.
        link_s: The one-time token expires this long after it was made.
    """

    operator_token: str
    idle_s: float = 12 * 3600.0
    lifetime_s: float = 12 * 3600.0
    link_s: float = 600.0
    login_token: str = field(default_factory=lambda: secrets.token_urlsafe(32))
    _made: float = field(default_factory=lambda: time.monotonic())  # (the clock as called)
    _spent: bool = False
    #: Each live session's login and last use (monotonic seconds).
    _sessions: dict[str, tuple[float, float]] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def login(self, token: str) -> str:
        """A new session for ``token`` (the unspent one-time token, or the operator token).

        Returns:
            The session id to set as the cookie.

        Raises:
            BadLogin: ``token`` is neither, or it is the one-time token spent or expired.
        """
        with self._lock:
            link = self._link_is(token)
            # (An empty token file's token — damaged, or edited — is no password: an
            # empty form field logged in.)
            operator = bool(self.operator_token) and same_token(token, self.operator_token)
            if not link and not operator:
                raise self._refusal()
            self._spent = True  # any login spends the link: it is nobody's after that
            session = secrets.token_urlsafe(32)
            now = time.monotonic()
            self._sessions[session] = (now, now)
            return session

    def check_link(self, token: str) -> None:
        """Refuse ``token`` unless it is the unspent, recent one-time token; spends nothing.

        Raises:
            BadLogin: It is not (the operator token included: never in a URL).
        """
        with self._lock:
            if not self._link_is(token):
                raise self._refusal()

    def _link_is(self, token: str) -> bool:
        """Whether ``token`` is the one-time token, unspent and unexpired (under the lock)."""
        if time.monotonic() - self._made > self.link_s:
            self._spent = True
        return not self._spent and same_token(token, self.login_token)

    def _refusal(self) -> BadLogin:
        return BadLogin(
            "this login link or token is not valid (a login link works once, "
            f"within {self.link_s / 60:.0f} minutes)",
            expected="the link `fogshift dashboard` printed, unused and recent, or the "
            "operator token in <home>/token",
            hint="paste the token from <home>/token into the form, or start "
            "`fogshift dashboard` again for a new link",
        )

    def valid(self, session: str | None) -> bool:
        """Whether ``session`` is live (and mark it used now)."""
        if not session:
            return False
        now = time.monotonic()
        with self._lock:
            for stale in [
                s
                for s, (began, used) in self._sessions.items()
                if now - used > self.idle_s or now - began > self.lifetime_s
            ]:
                del self._sessions[stale]
            if session not in self._sessions:
                return False
            self._sessions[session] = (self._sessions[session][0], now)
            return True

    def logout(self, session: str | None) -> None:
        with self._lock:
            self._sessions.pop(session or "", None)
