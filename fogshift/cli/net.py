"""``fogshift net``: the links of isolated nodes (``fogshift up --isolate``).

``partition`` cuts a node off without stopping it (its link drops every packet), ``heal``
restores the link, ``show`` lists each node's namespace, addresses, profile, link state and
the round-trip time measured through the link right now.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from fogshift.cli.output import make_console
from fogshift.common.options import ranged
from fogshift.exceptions import InvalidInput
from fogshift.supervisor import cluster as cluster_ops

app = typer.Typer(
    help="Isolated nodes' links (`fogshift up --isolate`): partition, heal, show.",
    no_args_is_help=True,
)
console = make_console()


def usable_home(home: Path) -> Path:
    """``--home`` if the OS will look it up (``Path.exists`` raises for anything but a
    missing file: a name over 255 bytes gave every command a traceback).

    Raises:
        InvalidInput: It cannot be looked up.
    """
    try:
        home.exists()
    except OSError as exc:
        raise InvalidInput(
            f"--home {str(home)[:200]!r} cannot be used: {exc.strerror or exc}",
            expected="a folder path the OS accepts (names of at most 255 bytes, 4096 in all) "
            "in folders this user may search",
            received=f"{type(exc).__name__}: {exc.strerror or exc} ({len(str(home))} characters)",
            hint="pass the --home `fogshift up` was started with (the default is .fogshift)",
        ) from None
    return home


# The main app's too (it imports this module).
Home = Annotated[
    Path,
    typer.Option(
        "--home",
        envvar="FOGSHIFT_HOME",
        help="Folder of the local cluster's state.",
        callback=usable_home,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print JSON instead of a table.")]
Node = Annotated[str, typer.Argument(help="The isolated node.")]


@app.command()
def partition(node: Node, home: Home = Path(".fogshift")) -> None:
    """Cut NODE off the network: it keeps running, but nothing reaches it or leaves it."""
    link = cluster_ops.partition(home.resolve(), node)
    console.print(f"[yellow]partitioned[/] {node} (interface {link.host_if} down)")


@app.command()
def heal(node: Node, home: Home = Path(".fogshift")) -> None:
    """Restore NODE's link after `fogshift net partition`."""
    link = cluster_ops.heal(home.resolve(), node)
    console.print(f"[green]healed[/] {node} (interface {link.host_if} up)")


@app.command()
def show(
    home: Home = Path(".fogshift"),
    as_json: AsJson = False,
    samples: Annotated[
        int,
        ranged("--samples", "Round trips timed per node.", 1),
    ] = 5,
) -> None:
    """Per isolated node: namespace, IPs, profile, link up/down and the RTT measured now."""
    rows = cluster_ops.network_status(home.resolve(), samples=samples)
    if as_json:
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
        return
    table = Table(title="isolated nodes")
    for column in ("node", "namespace", "host ip", "node ip", "profile", "link",
                   "rtt ms median (min-max)"):  # fmt: skip
        table.add_column(column)
    for row in rows:
        table.add_row(
            row["node"], row["namespace"], row["host_ip"], row["ns_ip"], row["profile"],
            "[green]up[/]" if row["link"] == "up" else f"[red]{row['link']}[/]", _rtt(row),
        )  # fmt: skip
    console.print(table)


def _rtt(row: dict[str, Any]) -> str:
    rtt = row["rtt"]
    if rtt is None:
        return f"- ({row['rtt_error']})"
    return f"{rtt['median_ms']:.1f} ({rtt['min_ms']:.1f}-{rtt['max_ms']:.1f})"
