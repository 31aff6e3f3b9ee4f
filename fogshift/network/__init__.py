"""Isolated nodes: each agent in a network namespace of its own, behind a shaped, delayed link.

* :mod:`~fogshift.network.links` — link profiles (bandwidth, delay distribution) and their
  syntax (``10mbit,n100``);
* :mod:`~fogshift.network.namespaces` — namespaces, veth pairs, ``tbf``, partition/heal,
  clean-up of leftovers;
* :mod:`~fogshift.network.relay` — the TCP relay that delays each chunk (no ``netem`` here)
  and connects the namespace to the loopback-bound broker and orchestrator;
* :mod:`~fogshift.network.rtt` — the round-trip time a link actually gives.
"""

from fogshift.network.links import LinkProfile, parse_link_assignments, parse_link_profile
from fogshift.network.namespaces import NodeLink
from fogshift.network.rtt import RttReport, measure_rtt

__all__ = [
    "LinkProfile",
    "NodeLink",
    "RttReport",
    "measure_rtt",
    "parse_link_assignments",
    "parse_link_profile",
]
