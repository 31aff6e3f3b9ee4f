"""Link profiles: the syntax, the delay distribution, and the refusal of bad profiles."""

from __future__ import annotations

import random
import statistics

import pytest

from fogshift.exceptions import InvalidInput
from fogshift.network.exceptions import BadLinkProfile
from fogshift.network.links import (
    LinkProfile,
    bandwidth_bps,
    parse_link_assignments,
    parse_link_profile,
)

NODES = ["cloud", "fog-a", "fog-b"]


@pytest.mark.parametrize(
    ("text", "bandwidth", "mean_ms", "sd_ms"),
    [
        ("n0", None, 0.0, 0.0),
        ("n100", None, 100.0, 10.0),
        ("n500", None, 500.0, 50.0),
        ("normal:250:40", None, 250.0, 40.0),
        ("normal:0.5:0", None, 0.5, 0.0),
        ("10mbit", "10mbit", 0.0, 0.0),
        ("10mbit,n100", "10mbit", 100.0, 10.0),
        ("N500, 1Gbit", "1gbit", 500.0, 50.0),
        ("512kbit,normal:20:5", "512kbit", 20.0, 5.0),
    ],
)
def test_profiles_parse_to_their_bandwidth_and_delay(
    text: str, bandwidth: str | None, mean_ms: float, sd_ms: float
) -> None:
    profile = parse_link_profile(text)
    assert (profile.bandwidth, profile.mean_ms, profile.sd_ms) == (bandwidth, mean_ms, sd_ms)
    # The label is the profile again, in the same syntax.
    assert parse_link_profile(profile.label()) == profile


@pytest.mark.parametrize(
    ("text", "bps"),
    [("8kbit", 8_000), ("10mbit", 10_000_000), ("1.5gbit", 1_500_000_000),
     ("100kbps", 800_000), ("2mbps", 16_000_000), ("64000bit", 64_000)],
)  # fmt: skip
def test_bandwidth_units_follow_tc(text: str, bps: int) -> None:
    # tc: *bit are bits per second, *bps are BYTES per second, k/m/g are powers of 1000.
    assert bandwidth_bps(text) == bps
    assert parse_link_profile(text).bandwidth_bps == bps


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("", "bad link profile for node 'fog-a'"),
        ("fast", "bad part 'fast'"),
        ("100", "a bare number needs a unit"),
        ("n100,n500", "has two delays"),
        ("10mbit,1mbit", "has two bandwidths"),
        ("10mbit,n100,n5", "bad link profile"),
        ("10mbit,,n100", "bad link profile"),
        ("normal:100", "bad part 'normal:100'"),
        ("normal:-5:1", "bad part"),
        ("n-5", "bad part"),
        ("1bit", "outside what a link can be"),
        ("1000gbit", "outside what a link can be"),
        ("n100000", "too long"),
        ("normal:10:70000", "standard deviation"),
    ],
)
def test_bad_profiles_are_refused_with_what_was_expected(text: str, says: str) -> None:
    with pytest.raises(BadLinkProfile) as caught:
        parse_link_profile(text, node="fog-a")
    error = caught.value
    assert isinstance(error, InvalidInput) and error.http_status == 422
    assert says in error.render()
    assert error.expected, "a refusal says what was expected"
    assert error.received is not None


def test_a_profile_model_refuses_negative_or_nan_delays_and_bad_bandwidths() -> None:
    for bad in ({"mean_ms": -1.0}, {"sd_ms": -0.1}, {"mean_ms": float("nan")}):
        with pytest.raises(ValueError):
            LinkProfile.model_validate(bad)
    with pytest.raises(BadLinkProfile, match="bad bandwidth 'lots'"):
        LinkProfile(bandwidth="lots")


def test_delays_are_normal_truncated_at_zero() -> None:
    rng = random.Random(7)
    n100 = parse_link_profile("n100")
    draws = [n100.sample_delay_s(rng) * 1000 for _ in range(4000)]
    assert statistics.fmean(draws) == pytest.approx(100, abs=1.5)
    assert statistics.stdev(draws) == pytest.approx(10, abs=1.0)
    # A deviation as large as the mean: truncation (not clipping) keeps every draw above 0
    # without piling draws up at exactly 0.
    wide = parse_link_profile("normal:10:10")
    draws = [wide.sample_delay_s(rng) for _ in range(4000)]
    assert min(draws) >= 0
    assert sum(d == 0 for d in draws) < 5
    assert parse_link_profile("n0").sample_delay_s(rng) == 0
    assert not parse_link_profile("n0").delayed and parse_link_profile("n100").delayed


def test_link_assignments_give_every_node_a_profile() -> None:
    profiles = parse_link_assignments(["fog-a=10mbit,n100", "*=n500"], NODES)
    assert profiles["fog-a"] == parse_link_profile("10mbit,n100")
    assert profiles["cloud"] == profiles["fog-b"] == parse_link_profile("n500")
    assert parse_link_assignments(["fog-b=n100"], NODES)["cloud"] == LinkProfile()


@pytest.mark.parametrize(
    ("items", "says"),
    [
        (["fog-a"], "bad --link option"),
        (["=n100"], "bad --link option"),
        (["fog-z=n100"], "names node 'fog-z', which is not started"),
        (["fog-a=n100", "fog-a=n500"], "sets node 'fog-a' twice"),
        (["*=n0", "*=n100"], "sets node '*' twice"),
        (["fog-b=n100,warp9"], "bad part 'warp9' in the link profile for node 'fog-b'"),
    ],
)
def test_bad_link_assignments_are_refused(items: list[str], says: str) -> None:
    with pytest.raises(BadLinkProfile) as caught:
        parse_link_assignments(items, NODES)
    assert says in caught.value.render()
