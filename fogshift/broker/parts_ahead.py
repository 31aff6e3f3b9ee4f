"""The parts of large key states addressed to a partition, fetched as the broker stores them.

A key state larger than :data:`~fogshift.broker.keys.INLINE_STATE_BYTES` travels in parts on
its target's subject (``.state.<element>.<to>``, :func:`~fogshift.broker.naming.state_subject`), and
then a record on its origin's ``.keys.<origin>`` names them. Read only once the batch that
holds the record runs, the parts cross the target's link after they crossed the origin's:
behind two 10 Mbit/s links, a precopy of six 1 MiB states took ~7 s, twice the time one
link needs, and the target's batch, every key of it, waited for the second half. Fetched by
the partition's planner while the origin is still sending, they cross both links at once,
and the batch finds them in its partition (:class:`~fogshift.broker.datasource.JetStreamPartition`).

Nothing here is needed for correctness: a part not held (not read yet, dropped, or stored
before the query started) is read by the batch itself, as before.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import time
from collections.abc import Iterable
from typing import Any

from fogshift.broker.client import SyncJetStream, read_ahead

log = logging.getLogger("fogshift.broker")

#: The most bytes of parts held at once; past that the reads pause (a batch then reads what
#: it needs itself).
PARTS_AHEAD_BYTES = 256 * 1024 * 1024
#: Parts asked for in one read.
PARTS_PER_READ = 16
#: Pause after a read that found nothing (or failed) while keys move to the partition: how
#: late a part may be noticed.
PARTS_POLL_S = 0.2
#: The pause while none do: a request every 2 s per partition, not five a second, whose
#: first read after a move's request comes at once (:meth:`PartsAhead.wake`).
PARTS_IDLE_POLL_S = 2.0
#: How long after a wake, or a part read, the reads stay quick.
PARTS_BUSY_S = 30.0
#: A part no batch took this long after it was read is dropped: its record never came (its
#: origin failed first and, restored, sent the state again, under new sequences).
PARTS_TTL_S = 120.0
#: The longest a batch waits for parts being read (reading them itself meanwhile would
#: fetch the same bytes twice over the link, each at half its speed).
PARTS_WAIT_S = 60.0


class PartsAhead:
    """Reads ``subject`` of ``stream`` after sequence ``after``, in the background on
    ``client``'s loop, until :meth:`stop`; :meth:`take` hands over what it holds.

    Args:
        client: The planner's broker client.
        stream: The input's stream.
        subject: The partition's ``.state.<element>.<to>`` subject.
        after: The position the query starts from.
    """

    def __init__(self, client: SyncJetStream, stream: str, subject: str, after: int) -> None:
        self.stream, self.subject = stream, subject
        self._held: dict[int, tuple[float, bytes]] = {}
        self._bytes = 0
        #: The sequence read up to: every part up to it is held, or was taken or dropped.
        self._last = after
        self._changed = threading.Condition()
        self._stopped = threading.Event()
        self._busy_until = 0.0
        #: Reads done so far, and those of them that found nothing (or failed).
        self.reads = 0
        self._dry = 0
        self._woken: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._future = client.submit(lambda js: self._rounds(js, after))

    async def _rounds(self, js: Any, after: int) -> None:
        self._woken, self._loop = asyncio.Event(), asyncio.get_running_loop()
        last = after
        while not self._stopped.is_set():
            got = []
            if self._bytes < PARTS_AHEAD_BYTES:
                try:
                    got = await read_ahead(js, self.stream, last, PARTS_PER_READ, self.subject)
                except Exception as exc:  # the batch reads what is missing, and says why
                    log.debug("reading %s after %d failed: %r", self.subject, last, exc)
            now = time.monotonic()
            self.reads += 1
            with self._changed:
                for message in got:
                    if message.seq not in self._held:
                        self._held[message.seq] = (now, message.data)
                        self._bytes += len(message.data)
                for seq in [s for s, (at, _) in self._held.items() if now - at > PARTS_TTL_S]:
                    self._bytes -= len(self._held.pop(seq)[1])
                if got:
                    self._last = got[-1].seq
                else:
                    self._dry += 1
                self._changed.notify_all()
            if got:
                last, self._busy_until = got[-1].seq, now + PARTS_BUSY_S
                continue
            self._woken.clear()
            pause = PARTS_POLL_S if now < self._busy_until else PARTS_IDLE_POLL_S
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._woken.wait(), pause)

    def wake(self) -> None:
        """Keys are moving to the partition (a copy or move request addressed to it was
        read): read now, and quickly for :data:`PARTS_BUSY_S`."""
        self._busy_until = time.monotonic() + PARTS_BUSY_S
        loop, woken = self._loop, self._woken
        if loop is not None and woken is not None:
            with contextlib.suppress(RuntimeError):  # the loop is closed: reading is over
                loop.call_soon_threadsafe(woken.set)

    def held(self) -> list[int]:
        """The sequences of the parts held, in order."""
        with self._changed:
            return sorted(self._held)

    def take(self, seqs: Iterable[int], wait_s: float = PARTS_WAIT_S) -> dict[int, bytes]:
        """The parts among ``seqs`` that are held, handed over (no longer held) — once the
        reads have passed the last of them, or for at most ``wait_s`` while they bring
        parts. ``seqs`` are stored already (a record names them once they are): a read
        begun after this call that finds nothing, or fails, means they will not come here
        (a stream without direct gets, the reads paused for :data:`PARTS_AHEAD_BYTES`),
        and so does a stop.

        Returns:
            The parts held, by sequence; the caller reads the others itself.
        """
        wanted = sorted(set(seqs))
        deadline = time.monotonic() + wait_s
        if wanted:
            self.wake()
        with self._changed:
            # The read under way may have begun before they were stored: the one after.
            dry = self._dry + 2
            while (
                wanted
                and self._last < wanted[-1]
                and any(s not in self._held for s in wanted)
                and self._dry < dry
                and not self._stopped.is_set()
                and not self._future.done()
                and (left := deadline - time.monotonic()) > 0
            ):
                self._changed.wait(min(left, PARTS_POLL_S))
            taken = {s: self._held.pop(s)[1] for s in wanted if s in self._held}
            self._bytes -= sum(map(len, taken.values()))
        return taken

    def stop(self) -> None:
        """Stop reading (idempotent)."""
        self._stopped.set()
        self._future.cancel()
        with self._changed:
            self._changed.notify_all()
