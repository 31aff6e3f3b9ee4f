"""Pacing what a node sends the central store's checkpoint pulls.

A central pull is background work: it must not take the node's uplink from the PEs' own
traffic. Sent at the link's full speed, a few MB of new state files fill the link's queue;
the PEs' small output messages then wait behind them or are dropped, and TCP's
retransmission timers stall them for seconds. Behind a 10 Mbit/s link, a key moved with
the precopy stopped for 1.5-5.6 s with unpaced pulls, 0.66-0.80 s without pulls
(``docs/results/pam-10mbit-zstd`` and ``pam-10mbit-nopulls``). Paced below the link's rate,
the queue stays short and a pull only takes longer.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from aiolimiter import AsyncLimiter

#: The most a pacer lets out at once, in seconds of its rate: a link queue holds ~100 ms
#: (``fogshift.network.namespaces``), and a burst must leave room in it for the PEs.
BURST_S = 0.05
#: The largest piece written to the socket at once.
CHUNK_BYTES = 16 * 1024


class Pacer:
    """Lets bytes out at no more than ``rate_bps`` on average, across every response that
    shares it (one per node: its pulls share one uplink), in bursts of :data:`BURST_S`.

    Args:
        rate_bps: Bits per second, at least 8 000.
    """

    def __init__(self, rate_bps: int) -> None:
        if rate_bps < 8000:
            raise ValueError(f"a pacing rate of {rate_bps} bit/s is below 8000 bit/s")
        self.rate_bps = rate_bps
        per_burst = rate_bps / 8 * BURST_S
        # aiolimiter's bucket holds max_rate and drains it every time_period: a bucket of one
        # burst, so an idle pacer lets out no more than that before it paces.
        self._limiter = AsyncLimiter(per_burst, BURST_S)
        self.chunk = max(1, min(CHUNK_BYTES, int(per_burst)))

    async def paced(self, data: bytes) -> AsyncIterator[bytes]:
        """``data`` in pieces of at most :attr:`chunk` bytes, each once the rate allows."""
        view = memoryview(data)
        for start in range(0, len(view), self.chunk):
            piece = view[start : start + self.chunk]
            await self._limiter.acquire(len(piece))
            yield bytes(piece)
