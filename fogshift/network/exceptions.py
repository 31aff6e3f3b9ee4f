"""Errors of node isolation: link profiles, namespaces, relays, partitions."""

from __future__ import annotations

from fogshift.exceptions import FogshiftError, InvalidInput, Unavailable


class BadLinkProfile(InvalidInput):
    """A link profile (bandwidth and delay) that cannot be parsed or makes no sense."""

    code = "bad_link_profile"


class NotIsolated(InvalidInput):
    """A network command about a node that does not run in a namespace of its own."""

    code = "not_isolated"


class IsolationUnsupported(Unavailable):
    """This machine or user cannot create network namespaces (not root, no ``ip``/``tc``)."""

    code = "isolation_unsupported"


class NetworkCommandFailed(FogshiftError):
    """An ``ip`` or ``tc`` command failed; the message names the command and its output."""

    code = "network_command_failed"


class RelayFailed(Unavailable):
    """A node's link relay did not start, or is not running."""

    code = "relay_failed"


class LinkDown(Unavailable):
    """A node's link carries no traffic (partitioned, or its relay is gone)."""

    code = "link_down"
