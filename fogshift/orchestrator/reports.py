"""Each PE's last migration and restore report, kept in the registry: an orchestrator
started again (after a crash, or `up` after `down`) showed none, and a migration its
predecessor died in said nothing of how it ended."""

from __future__ import annotations

import logging
from collections.abc import Iterator, MutableMapping
from typing import Generic, TypeVar

from pydantic import BaseModel, ValidationError

from fogshift.common.text import one_line
from fogshift.orchestrator.registry import Registry

log = logging.getLogger(__name__)

R = TypeVar("R", bound=BaseModel)


class KeptReports(MutableMapping[tuple[str, str], R], Generic[R]):
    """``(pipeline, element)`` -> its last report of one kind, written through to the
    registry (a report whose pipeline is gone is not kept) and read back at start.

    A report stored by an older fogshift that this one's contract refuses is dropped (as
    if none), said in the log.
    """

    def __init__(self, registry: Registry, kind: str, model: type[R]) -> None:
        self._registry, self._kind = registry, kind
        self._held: dict[tuple[str, str], R] = {}
        for key, text in registry.reports(kind).items():
            try:
                self._held[key] = model.model_validate_json(text)
            except ValidationError as exc:
                log.warning("the last %s report of %s/%s kept is not readable, dropped: %s",
                            kind, *key, one_line(str(exc))[:300])  # fmt: skip
                registry.drop_report(*key, kind)

    def __getitem__(self, key: tuple[str, str]) -> R:
        return self._held[key]

    def __setitem__(self, key: tuple[str, str], report: R) -> None:
        if self._registry.put_report(*key, self._kind, report.model_dump_json()):
            self._held[key] = report
        else:  # (its pipeline is gone: deleted, or deployed anew meanwhile)
            self._held.pop(key, None)

    def __delitem__(self, key: tuple[str, str]) -> None:
        del self._held[key]
        self._registry.drop_report(*key, self._kind)

    def __iter__(self) -> Iterator[tuple[str, str]]:
        return iter(list(self._held))

    def __len__(self) -> int:
        return len(self._held)
