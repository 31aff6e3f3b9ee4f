"""Link profiles: the bandwidth and delay of an isolated node's link to the rest.

A profile is written as up to two comma-separated parts, in any order:

* a **delay**: ``n<MEAN>`` (normal, mean MEAN ms, standard deviation MEAN/10 ms: ``n0``,
  ``n100`` = 100 ± 10 ms, ``n500`` = 500 ± 50 ms) or ``normal:<MEAN>:<SD>`` (ms);
* a **bandwidth**: a number and a unit of ``tc``: ``bit``, ``kbit``, ``mbit``, ``gbit``
  (bits per second) or ``bps``, ``kbps``, ``mbps``, ``gbps`` (*bytes* per second, as in
  ``tc``); ``k``/``m``/``g`` are powers of 1000.

Examples: ``n100``, ``10mbit``, ``10mbit,n100``, ``512kbit,normal:250:40``. A missing part
means no limit (bandwidth) or no delay.

The delay is one-way and applied per chunk of data by the node's relay
(:mod:`fogshift.network.relay`), in both directions, so a request/response round trip gains
about twice the mean. Samples are drawn from the normal distribution truncated at 0.
"""

from __future__ import annotations

import random
import re

from pydantic import BaseModel, ConfigDict, Field, field_validator

from fogshift.network.exceptions import BadLinkProfile

#: Longest mean or deviation accepted (ms): beyond this a "link" is an outage, not a delay.
MAX_DELAY_MS = 60_000.0
#: Slowest and fastest bandwidth accepted (bit/s). Below ~8 kbit/s one 1500-byte packet
#: takes longer than ``tc``'s queue allows; above 100 Gbit/s no veth gets near it.
MIN_BANDWIDTH_BPS = 8_000
MAX_BANDWIDTH_BPS = 100_000_000_000

_UNITS = {
    "bit": 1,
    "kbit": 1_000,
    "mbit": 1_000_000,
    "gbit": 1_000_000_000,
    "bps": 8,
    "kbps": 8_000,
    "mbps": 8_000_000,
    "gbps": 8_000_000_000,
}
_NUMBER = r"(\d+(?:\.\d+)?)"
_BANDWIDTH = re.compile(_NUMBER + r"(" + "|".join(_UNITS) + r")", re.IGNORECASE)
_PRESET = re.compile(r"n" + _NUMBER, re.IGNORECASE)
_NORMAL = re.compile(r"normal:" + _NUMBER + r":" + _NUMBER, re.IGNORECASE)

PROFILE_SYNTAX = (
    "a delay n<MEAN> (n0, n100, n500) or normal:<MEAN_MS>:<SD_MS>, a bandwidth such as "
    "10mbit or 512kbit, or both separated by a comma (10mbit,n100)"
)
#: The hint of a profile that is not one.
_EXAMPLES = "e.g. --link fog-a=10mbit,n100 (10 Mbit/s, 100 ms one way) or --link '*=n50'"


def bandwidth_bps(text: str, where: str = "") -> int:
    """The bits per second a ``tc`` rate such as ``10mbit`` or ``100kbps`` stands for.

    Args:
        text: The rate.
        where: Appended to error messages, e.g. `` for node 'fog-a'``.

    Raises:
        BadLinkProfile: ``text`` is not a rate, or is outside what a link can be.
    """
    match = _BANDWIDTH.fullmatch(text.strip())
    if match is None:
        raise BadLinkProfile(
            f"bad bandwidth {text!r}{where}",
            expected="a number and one of " + ", ".join(_UNITS) + " (e.g. 10mbit)",
            received=repr(text),
            hint="write the rate as tc does, e.g. 10mbit or 500kbit",
        )
    bps = round(float(match.group(1)) * _UNITS[match.group(2).lower()])
    if not MIN_BANDWIDTH_BPS <= bps <= MAX_BANDWIDTH_BPS:
        raise BadLinkProfile(
            f"bandwidth {text!r}{where} is outside what a link can be",
            expected=f"between {MIN_BANDWIDTH_BPS // 1000}kbit and "
            f"{MAX_BANDWIDTH_BPS // 1_000_000_000}gbit",
            received=f"{bps} bit/s",
            hint="choose a rate within those bounds",
        )
    return bps


class LinkProfile(BaseModel):
    """The bandwidth and one-way delay distribution of a node's link.

    Attributes:
        bandwidth: A ``tc`` rate (``10mbit``), lower-case, or ``None`` for no limit. Applied
            in each direction separately (``tbf`` on both ends of the veth pair).
        mean_ms: Mean one-way delay (ms), added by the relay to every chunk, each direction.
        sd_ms: Its standard deviation (ms); the distribution is normal, truncated at 0.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    bandwidth: str | None = None
    mean_ms: float = Field(default=0.0, ge=0.0, le=MAX_DELAY_MS)
    sd_ms: float = Field(default=0.0, ge=0.0, le=MAX_DELAY_MS)

    @field_validator("bandwidth")
    @classmethod
    def _valid_bandwidth(cls, value: str | None) -> str | None:
        if value is None:
            return None
        bandwidth_bps(value)  # raises with a clear message
        return value.strip().lower()

    @property
    def bandwidth_bps(self) -> int | None:
        """The bandwidth in bit/s, or ``None`` for no limit."""
        return None if self.bandwidth is None else bandwidth_bps(self.bandwidth)

    @property
    def delayed(self) -> bool:
        """Whether the relay adds any delay at all."""
        return self.mean_ms > 0 or self.sd_ms > 0

    def sample_delay_s(self, rng: random.Random) -> float:
        """One one-way delay in seconds, from the normal distribution truncated at 0.

        Truncation is by rejection: the mean is never negative, so at least every second
        draw is kept, and the shape above 0 is the normal's (not a spike at 0).
        """
        if self.sd_ms == 0:
            return self.mean_ms / 1000
        while True:
            value = rng.gauss(self.mean_ms, self.sd_ms)
            if value >= 0:
                return value / 1000

    def label(self) -> str:
        """The profile in the syntax :func:`parse_link_profile` reads back."""
        delay = f"normal:{self.mean_ms:g}:{self.sd_ms:g}"
        if self.mean_ms / 10 == self.sd_ms:
            delay = f"n{self.mean_ms:g}"
        if self.bandwidth is None:
            return delay
        return f"{self.bandwidth},{delay}" if self.delayed else self.bandwidth


def parse_link_profile(text: str, node: str | None = None) -> LinkProfile:
    """Parse a profile such as ``n100``, ``10mbit`` or ``10mbit,n500`` (module docstring).

    Args:
        text: The profile.
        node: The node it is for, named in errors.

    Raises:
        BadLinkProfile: ``text`` is not a profile; the message says which part is wrong.
    """
    where = f" for node {node!r}" if node else ""
    parts = [p.strip() for p in text.split(",")]
    if not text.strip() or len(parts) > 2 or not all(parts):
        raise BadLinkProfile(
            f"bad link profile{where}", expected=PROFILE_SYNTAX, received=repr(text),
            hint=_EXAMPLES,
        )  # fmt: skip
    bandwidth: str | None = None
    delay: tuple[float, float] | None = None
    for part in parts:
        preset = _PRESET.fullmatch(part)
        normal = _NORMAL.fullmatch(part)
        if preset or normal:
            if delay is not None:
                raise BadLinkProfile(
                    f"link profile{where} has two delays", expected=PROFILE_SYNTAX,
                    received=repr(text), hint="keep one delay, e.g. 10mbit,n100",
                )  # fmt: skip
            if preset:
                mean = float(preset.group(1))
                delay = (mean, mean / 10)
            else:
                assert normal is not None
                delay = (float(normal.group(1)), float(normal.group(2)))
        elif _BANDWIDTH.fullmatch(part):
            if bandwidth is not None:
                raise BadLinkProfile(
                    f"link profile{where} has two bandwidths", expected=PROFILE_SYNTAX,
                    received=repr(text), hint="keep one bandwidth, e.g. 10mbit,n100",
                )  # fmt: skip
            bandwidth = part
        else:
            bare = re.fullmatch(_NUMBER, part) is not None
            raise BadLinkProfile(
                f"bad part {part!r} in the link profile{where}",
                expected=PROFILE_SYNTAX,
                received=repr(text),
                hint=f"a bare number needs a unit ({part}mbit) or a delay prefix (n{part})"
                if bare
                else _EXAMPLES,
            )
    mean_ms, sd_ms = delay or (0.0, 0.0)
    for what, value in (("mean", mean_ms), ("standard deviation", sd_ms)):
        if value > MAX_DELAY_MS:
            raise BadLinkProfile(
                f"the delay's {what} in the link profile{where} is too long",
                expected=f"at most {MAX_DELAY_MS:.0f} ms",
                received=f"{value:g} ms",
                hint=f"choose a {what} of at most {MAX_DELAY_MS:.0f} ms",
            )
    if bandwidth is not None:
        bandwidth_bps(bandwidth, where)
    return LinkProfile(bandwidth=bandwidth, mean_ms=mean_ms, sd_ms=sd_ms)


def parse_link_assignments(items: list[str], nodes: list[str]) -> dict[str, LinkProfile]:
    """Parse ``--link`` options ``NODE=PROFILE`` into a profile for every node in ``nodes``.

    ``*=PROFILE`` sets the profile of every node not named otherwise; nodes without any get
    the empty profile (no limit, no delay).

    Raises:
        BadLinkProfile: A malformed item, a bad profile, an unknown node or a node named twice.
    """
    default: LinkProfile | None = None
    named: dict[str, LinkProfile] = {}
    for item in items:
        node, sep, profile = item.partition("=")
        node = node.strip()
        if not sep or not node:
            raise BadLinkProfile(
                "bad --link option",
                expected="NODE=PROFILE, e.g. fog-a=10mbit,n100 (or *=PROFILE for every node)",
                received=repr(item),
                hint="name the node before '='",
            )
        if node != "*" and node not in nodes:
            raise BadLinkProfile(
                f"--link names node {node!r}, which is not started",
                expected="one of " + ", ".join(nodes) + " (or * for every node)",
                received=repr(item),
                hint="give --link for a node named in --nodes",
            )
        if node in named or (node == "*" and default is not None):
            raise BadLinkProfile(
                f"--link sets node {node!r} twice",
                expected="one --link per node",
                received=repr(item),
                hint=f"drop one of the --link options for {node!r}",
            )
        parsed = parse_link_profile(profile, None if node == "*" else node)
        if node == "*":
            default = parsed
        else:
            named[node] = parsed
    return {n: named.get(n, default or LinkProfile()) for n in nodes}
