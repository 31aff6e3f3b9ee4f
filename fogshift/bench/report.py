"""``results.md`` and the PNGs, rendered from the CSV files of a bench output folder only.

Re-rendering (``fogshift bench report --out DIR``) gives the same document from the same
CSVs: no number reaches the document any other way, except the thesis's cited ones.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import ModuleType

from fogshift.bench import e1, e2, e3, ecg, pam, seamless
from fogshift.bench.base import fmt

EXPERIMENTS: tuple[ModuleType, ...] = (e1, e2, e3, seamless, ecg, pam)


def _commands(out: Path) -> list[str]:
    path = out / "machine.json"
    commands = json.loads(path.read_text()).get("commands", []) if path.exists() else []
    lines = [
        f"- `{c['command']}`: {c['wall_s'] / 60:.1f} min"
        + ("" if c.get("completed") else " (did not complete)")
        + (
            f", started {c['started_at']}, load average then "
            + "/".join(f"{x:g}" for x in c["load_average_at_start"])
            if c.get("started_at")
            else ""
        )
        for c in commands
    ]
    return ["Produced by:", "", *lines, ""] if lines else []


def _machine(out: Path) -> list[str]:
    path = out / "machine.json"
    if not path.exists():
        return []
    m = json.loads(path.read_text())
    return [
        "## Machine",
        "",
        "| cores | CPU | RAM | OS | Python | Java | Spark | nats-server |",
        "|---|---|---|---|---|---|---|---|",
        f"| {m.get('cores')} | {m.get('cpu_model')} | {fmt(m.get('ram_gib'), 1)} GiB | "
        f"{m.get('os')} | {m.get('python')} | {m.get('java')} | {m.get('spark')} | "
        f"{m.get('nats_server') or '-'} |",
        "",
        "All nodes, the orchestrator and nats-server share this one machine; other work may "
        "have run on it at the same time (see *machine busy*, % of all cores, in the tables). "
        "The thesis ran the aggregate on a Raspberry Pi 4 and everything else on a 6-core "
        "desktop (§6.1, p. 43-44).",
        "",
    ]


def render(out: Path, plots: bool = True) -> Path:
    """Draw every experiment's plots and write ``out/results.md``; returns its path.

    Args:
        out: The bench output folder (``e1/``, ``e2/``, ... with their CSVs, and
            ``machine.json`` with the commands that produced them).
        plots: Draw the plots too (False: the tables only, which need no matplotlib; the
            plots already beside them are left as they are).
    """
    parts = [
        "# fogshift bench results",
        "",
        "Every number below is computed from the CSV files beside this document (one row "
        "per run; re-render with `fogshift bench report --out DIR`). Thesis figures are "
        "those printed in D. Gomm, *Adapting Stream Processing Pipelines in Fog "
        "Infrastructures* (KIT), chapter 6, cited by figure and page "
        "(`fogshift/bench/thesis.py`). A run counts only if its whole output equals the "
        "independent reference (`fogshift.verify.reference`): a fast but inconsistent run "
        "is a failure.",
        "",
    ]
    parts += _commands(out) + _machine(out)
    for experiment in EXPERIMENTS:
        folder = out / experiment.NAME
        if not folder.is_dir():
            continue
        try:
            if plots:
                experiment.plot(folder)
        except ImportError:  # matplotlib is the `bench` extra: the tables need no plots
            parts += [f"(no plots of {experiment.NAME}: `pip install 'fogshift[bench]'`)", ""]
        text = experiment.section(folder)
        if text:
            parts += [text, ""]
    path = out / "results.md"
    path.write_text("\n".join(parts).rstrip() + "\n")
    return path
