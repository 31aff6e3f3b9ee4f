"""The consoles the ``fogshift`` commands print with."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from rich.console import Console
from rich.markup import escape as escape_markup
from rich.status import Status
from rich.text import Text

#: Columns a table may take when the output is not a terminal (a pipe, a file) and
#: ``COLUMNS`` does not say: Rich's default there is 80, which wrapped each row of `nodes`
#: or `status` over several lines (a `| grep NODE` found parts of rows).
PIPED_COLUMNS = 200


def make_console(**options: Any) -> Console:
    """A Rich console (``options`` as :class:`rich.console.Console` takes them) as wide as
    the terminal, or :data:`PIPED_COLUMNS` wide when the output is not one and ``COLUMNS``
    is not set."""
    console = Console(**options)
    if not console.is_terminal and not os.environ.get("COLUMNS"):
        console.width = PIPED_COLUMNS
    return console


#: The characters a terminal acts on instead of showing (ESC starts a sequence that moves the
#: cursor, clears the screen, retitles the window or sets the clipboard; CSI in 8 bits;
#: BEL, BS, CR...), each written as ``\\xNN``: C0 controls but tab and line feed, DEL and
#: the C1 controls. Rich passes most of them on as they are (it drops five).
_CONTROLS = {
    code: f"\\x{code:02x}"
    for code in (*range(0x00, 0x09), *range(0x0B, 0x20), 0x7F, *range(0x80, 0xA0))
}


def visible(text: str) -> str:
    """``text`` with the control characters a terminal would act on written as ``\\xNN``.

    For what a command prints of data: a key, a state, a dead letter's reason, an event, an
    error quoting input. A key holding ``ESC [ 2 J`` cleared the operator's screen as
    `fogshift state` listed it.
    """
    return text.translate(_CONTROLS)


def escape(text: str) -> str:
    """``text`` for a Rich markup string: its control characters made :func:`visible`, its
    square brackets not read as markup."""
    return escape_markup(visible(text))


#: What starting a cluster says that stays on the screen once it is done: warnings (a
#: non-loopback address, a link left behind) and what it started again or added. The rest
#: is progress, shown by the spinner while it lasts (the warnings went with it).
KEPT_MESSAGES = ("warning:", "restarting ", "adding ", "the cluster's broker")


def progress_to(status: Status, console: Console) -> Callable[[str], None]:
    """A progress callback for ``cluster_ops.up``: each message on ``status``'s spinner,
    those of :data:`KEPT_MESSAGES` printed on ``console`` too."""

    def say(message: str) -> None:
        status.update(message)
        if message.startswith(KEPT_MESSAGES):
            console.print(Text(message, style="yellow" if message.startswith("warning:") else ""))

    return say
