"""A broker reloading its accounts, as a client sees it for a moment: a publish dropped (no
route yet) or answered by nobody. Made by redirecting a real connection's publishes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

#: Where a publish goes: the subject it goes to instead, or ``None`` (dropped).
Where = Callable[[str, dict[str, str]], str | None]

#: A subject nobody answers.
NOBODY = "fs-test.nobody"


class Redirecting:
    """A NATS connection whose plain publishes ``where`` may send elsewhere or drop; the
    subjects it changed, in order, in :attr:`changed`."""

    def __init__(self, nc: Any, where: Where, changed: list[str]) -> None:
        self._nc, self._where, self.changed = nc, where, changed

    def __getattr__(self, name: str) -> Any:
        return getattr(self._nc, name)

    async def publish(self, subject: str, payload: bytes = b"", reply: str = "",
                      headers: dict[str, str] | None = None) -> None:  # fmt: skip
        target = self._where(subject, headers or {})
        if target != subject:
            self.changed.append(subject)
        if target is not None:
            await self._nc.publish(target, payload, reply=reply, headers=headers)


def redirect(monkeypatch: pytest.MonkeyPatch, module: Any, where: Where) -> list[str]:
    """Make ``module.connection_of`` hand out :class:`Redirecting` connections; the
    subjects they changed."""
    real = module.connection_of
    changed: list[str] = []
    monkeypatch.setattr(module, "connection_of", lambda js: Redirecting(real(js), where, changed))
    return changed
