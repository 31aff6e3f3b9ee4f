"""A stateful processor whose every output depends on the order its two inputs meet it."""

from __future__ import annotations

from fogshift.events import Event
from fogshift.runtime.api import Processor, state


class Interleave(Processor):
    """Numbers every event it sees, whichever input it comes from: output ``n`` is the event's
    place in the merged order, so a different batch cut gives different outputs."""

    seen: int = state(0)

    def process(self, event: Event) -> dict[str, object]:
        self.seen += 1
        return {"n": self.seen, "src": event.creator, "src_seq": event.seq}
