"""What the tests that drive the dashboard in a real browser share (the ``dashboard`` and
``browser`` fixtures are in ``tests/conftest.py``): Debian's chromium and how it is started,
screenshots, and the phone-width check.

With ``FOGSHIFT_SCREENSHOTS=DIR`` the screenshots (the README's) are written to DIR too.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
#: As the machine's probe runs it: no sandbox as root, and none of the background
#: connections a closed network refuses.
CHROMIUM_ARGS = [
    "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
]  # fmt: skip

#: The page itself does not scroll sideways (its wide parts scroll inside their boxes).
PAGE_FITS = "document.documentElement.scrollWidth <= window.innerWidth + 1"


def overflowing(page: object) -> str:
    """The elements reaching past the viewport's right edge, widest first (a diagnosis)."""
    found = page.evaluate(  # type: ignore[attr-defined]
        "Array.from(document.querySelectorAll('body *'))"
        ".map(e => [e.tagName.toLowerCase() + (e.className && e.className.baseVal === undefined"
        " ? '.' + String(e.className).trim().replace(/\\s+/g, '.') : ''),"
        " Math.round(e.getBoundingClientRect().right)])"
        ".filter(([, right]) => right > window.innerWidth + 1)"
        ".sort((a, b) => b[1] - a[1]).slice(0, 8)"
    )
    return f"elements past the right edge (right px): {found}"


def shoot(page: object, tmp_path: Path, name: str) -> None:
    """A full-page screenshot ``name.png`` under ``tmp_path`` (and FOGSHIFT_SCREENSHOTS)."""
    path = tmp_path / "screenshots" / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)  # type: ignore[attr-defined]
    if os.environ.get("FOGSHIFT_SCREENSHOTS"):
        target = Path(os.environ["FOGSHIFT_SCREENSHOTS"])
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy(path, target / path.name)
