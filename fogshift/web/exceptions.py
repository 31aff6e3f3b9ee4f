"""Errors of the web dashboard."""

from __future__ import annotations

from fogshift.exceptions import FogshiftError


class NotLoggedIn(FogshiftError):
    """A request without a valid session cookie (the login page is the only way in)."""

    code = "not_logged_in"
    http_status = 401


class BadLogin(FogshiftError):
    """A login link or token that is wrong, or already used."""

    code = "bad_login"
    http_status = 403


class CrossSiteRequest(FogshiftError):
    """A state-changing request sent by another site's page (its ``Origin`` is not ours)."""

    code = "cross_site"
    http_status = 403
