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


class KeyedTally(Processor):
    """Numbers each key's events, whichever input each comes from: output ``n`` of a key is
    its event's place among the key's events as processed, so a key's state lost, repeated
    or taken twice on a move shows in its numbers."""

    seen: int = state(0)

    def process(self, event: Event) -> dict[str, object]:
        self.seen += 1
        return {"sensor": event.body["sensor"], "n": self.seen, "src": event.creator,
                "src_seq": event.seq}  # fmt: skip
