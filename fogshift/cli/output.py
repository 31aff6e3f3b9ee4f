"""The consoles the ``fogshift`` commands print with."""

from __future__ import annotations

import os
from typing import Any

from rich.console import Console

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
