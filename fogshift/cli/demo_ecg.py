"""``fogshift demo --case ecg``: Case 2 — the wearable's processing follows it to another
gateway mid-stream, that gateway is SIGKILLed and the orchestrator restores the processing;
the verdict compares the filtered signal and the alarms with the offline reference, and the
alarms with the simulator's ground truth.

``fogshift demo --case twins``: Case 2 with the patients' twins split over two gateways
(issue #16) — one patient's wearable comes near the other gateway mid-stream, and only that
patient's twin follows it (``migrate --keys``) while the other patients are classified on
where they were; the verdict compares every patient's alarms with the offline reference."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import numpy as np
from rich.console import Console

from fogshift.cli.demo import checkpointed, redeploy
from fogshift.common.http import ServiceClient
from fogshift.ecg.simulate import Patient, layout, patients
from fogshift.exceptions import InvalidInput, Unavailable
from fogshift.spec.models import ElementSpec, PipelineSpec, partition_of_key
from fogshift.supervisor import cluster as cluster_ops
from fogshift.verify.case2 import (
    Alarm,
    Case2Parts,
    case2_parts,
    quality,
    read_alarms,
    reference_alarms,
    reference_filtered,
)

#: The most stream sequences one read of the band-pass's output asks for.
PAGE = 5_000


def run_ecg(
    home: Path, spec: PipelineSpec, timeout_s: float, console: Console, target: str | None
) -> bool:
    """Deploy Case 2, move its processing, kill its gateway, let it be restored; True if
    the filtered signal and the alarms equal the reference's.

    1. Once every patient's twin has seen two windows, the amplifier, band-pass and
       classifier move as one group migration to ``target`` (default: the first healthy node
       hosting none of the pipeline's PEs), each handed over make-before-break.
    2. Once the classifier has a central checkpoint there and has processed two windows per
       patient beyond it, that node's process group is SIGKILLed (the input still flowing,
       unless the recordings are short).
    3. The orchestrator restores the three PEs elsewhere when the node has been silent for
       the spec's ``recovery.detect_after_s`` (or, with ``recovery.auto`` off, the demo asks
       for each restore).
    4. When the alarms are all there, each patient's filtered signal must equal the whole
       recording filtered at once (sample by sample, so no window boundary, migration or
       restore left a transient), and the alarms must equal the reference's.
    """
    parts = check_ecg(spec)
    source = parts.source
    people = patients(source.patients, source.seed, source.abnormal_every, source.onset_s)
    expected = reference_alarms(source, parts.amplify, parts.band, parts.classify)
    pipeline = spec.pipeline
    with cluster_ops.orchestrator_client(home, cluster_ops.OPERATION_TIMEOUT_S) as client:
        redeploy(client, spec)
        console.print(
            f"deployed [bold]{pipeline}[/] ({source.patients} patients, {source.duration_s:g} s "
            f"of ECG each at {source.speed:g}x): "
            + ", ".join(f"{e.id}@{e.node}" for e in spec.elements)
        )
        deadline = time.monotonic() + timeout_s
        _wait(client, pipeline, parts.bandpass, 2 * source.patients, deadline, console,
              "every twin warm")  # fmt: skip
        placed = {e.id for e in spec.elements}
        target = target or _spare(client, pipeline, placed)
        if not _move(client, pipeline, parts, target, console):
            return False
        console.print(
            f"handed over [bold]{', '.join(parts.processing)}[/] to {target} as one group "
            + _flow(client, spec, parts, "while the patients stream")
            + " (make-before-break: each target live beside its origin first)"
        )
        source_id = _source_id(spec)
        _status, host, central = checkpointed(
            client, pipeline, parts.classifier, 2 * source.patients, console, deadline,
            ended=lambda status: _sent(status, source_id) >= parts.windows,
        )  # fmt: skip
        killed = str(host["name"])
        cluster_ops.kill_group(int(host["pgid"]), signal.SIGKILL)
        flow = _flow(client, spec, parts, "while the wearables still stream")
        console.print(
            f"[red]killed[/] node [bold]{killed}[/] (SIGKILL of its process group) with "
            f"{', '.join(parts.processing)} on it, {flow}; the classifier's central checkpoint: "
            + (f"batch {central['batch']}, {central['age_ms']:.0f} ms old" if central else "none")
        )
        if not _restored(client, spec, parts, killed, deadline, console):
            return False
        _wait(client, pipeline, parts.bandpass, parts.windows, deadline, console,
              "every window filtered")  # fmt: skip
        # And classified: the sink's count alone passed while a restored classifier still
        # lagged, and an alarm it raised after the read went unseen.
        _wait(client, pipeline, parts.classifier, parts.windows, deadline, console,
              "every window classified", field="events_in")  # fmt: skip
        sink = next(e.id for e in spec.elements if e.kind == "csv-sink")
        _wait(client, pipeline, sink, len(expected), deadline, console, "every alarm")
        time.sleep(1.0)  # a duplicate would show up within a batch or two: give it the chance
        filtered = _filtered(client, pipeline, parts.bandpass)
        dead = sum(e["dead_letters"] for e in client.get(f"/pipelines/{pipeline}")["elements"])
    problems = _compare_filtered(filtered, reference_filtered(source, parts.amplify, parts.band))
    alarms = read_alarms(parts.alarms)
    if alarms != expected:
        problems.append(f"alarms {alarms} differ from the reference's {expected}")
    if dead:
        problems.append(f"{dead} dead letters (the simulated signal has no bad event)")
    samples = sum(len(v) for v in filtered.values())
    if problems:
        console.print("[red]INCONSISTENT[/]: " + "; ".join(problems))
    else:
        console.print(
            f"[green]CONSISTENT[/]: {samples} filtered samples of {len(filtered)} patients "
            f"equal the recordings filtered whole, sample by sample; {len(alarms)} alarms "
            "equal the reference's"
        )
    detected = _detected(console, alarms, people, source.duration_s)
    return not problems and detected


def _detected(
    console: Console, alarms: list[Alarm], people: list[Patient], duration_s: float
) -> bool:
    """Print the detection's quality against the simulator's ground truth; whether it has
    no problem (a missed patient, an alarm on a normal stretch, a ``normal`` one after the
    onset). The reference shares the detector, so alarms equal to its prove the state
    survived the moves, not that the detection is right: this does."""
    found = quality(alarms, people, duration_s)
    latency = ", ".join(f"{k} {v:.1f} s" for k, v in sorted(found.latency_s.items()))
    console.print(
        f"detection against the simulator's ground truth: sensitivity {found.sensitivity:.2f}, "
        f"specificity {found.specificity:.2f}; onset -> alarm: {latency or 'no abnormal patient'}"
    )
    missed = found.problems()
    if missed:
        console.print("[red]DETECTION FAILED[/]: " + "; ".join(missed))
    return not missed


def run_twins(home: Path, spec: PipelineSpec, timeout_s: float, console: Console) -> bool:
    """Deploy Case 2 with the classifier's twins split over gateways, move one patient's
    twin to the other gateway mid-stream, compare with the reference; True if equal.

    1. Once the first partition has taken in two windows of each patient (it reads them
       all and classifies its own), the first of its patients (by id) walks to the
       gateway of the next partition on another node: ``migrate --keys`` moves only that
       patient's twin there.
    2. When every window is filtered and the alarms are all there, each patient's alarms
       must equal the reference's in their order (the partitions' alarms interleave at the
       sink), each twin must have taken in every sample of its recording once (the moved
       one's history crossed with it: a twin started afresh would count from 0), the moved
       twin must be read at its new partition, and the first partition must hold the twins
       of its other patients and be the same run (same epoch, no restart): they never
       noticed.

    Raises:
        InvalidInput: Not Case 2, or its classifier not split over two gateways or more.
    """
    parts, parted = check_twins(spec)
    source, pipeline = parts.source, spec.pipeline
    origin, target = parted[0], next(e for e in parted if e.node != parted[0].node)
    assert origin.partition is not None
    people = patients(source.patients, source.seed, source.abnormal_every, source.onset_s)
    names = [p.name for p in people]
    here = [n for n in names if partition_of_key(n, origin.partition.first_count) == 0]
    if not here:
        raise InvalidInput(
            f"pipeline {pipeline!r}: no patient's twin is on {origin.id}",
            expected=f"at least one patient whose id hashes to {origin.id}",
            received=", ".join(names),
            hint="more patients (the ecg-source's patients option)",
        )
    walker, stay = here[0], sorted(here[1:])
    expected = reference_alarms(source, parts.amplify, parts.band, parts.classify)
    with cluster_ops.orchestrator_client(home, cluster_ops.OPERATION_TIMEOUT_S) as client:
        redeploy(client, spec)
        console.print(
            f"deployed [bold]{pipeline}[/] ({source.patients} patients; the twins of "
            f"{', '.join(here)} on {origin.node}, the others on "
            f"{', '.join(sorted({e.node for e in parted[1:]}))}): "
            + ", ".join(f"{e.id}@{e.node}" for e in spec.elements)
        )
        deadline = time.monotonic() + timeout_s
        # A partition reads every patient's windows (the others' it passes over): one each,
        # so that the twins hold state and most of the recordings still stream (on a loaded
        # machine, waiting for two each once left none of the walker's windows to come).
        _wait(client, pipeline, origin.id, source.patients, deadline, console,
              f"{origin.node}'s twins warm", field="events_in")  # fmt: skip
        before = _element(client, pipeline, origin.id)
        flow = _flow(client, spec, parts, "while the patients stream")
        report = client.post(
            f"/pipelines/{pipeline}/elements/{parts.classifier}/keys/migrate",
            json={"keys": [walker], "target": target.node},
        )
        if report["status"] != "moved":
            console.print(f"[red]the key move ended {report['status']}[/]: {report['error']}")
            return False
        console.print(
            f"{walker}'s wearable came near {target.node}: moved only {walker}'s twin, "
            f"{report['origins'].get(walker)}@{origin.node} -> "
            f"{report['target_partition']}@{target.node}, {flow}; "
            f"its state ({report['state_bytes']} bytes) stored "
            f"{report['stoppage_ms'].get(walker, 0.0):.0f} ms after the move (input seq "
            f"{report['move_seq']})"
        )
        _wait(client, pipeline, parts.bandpass, parts.windows, deadline, console,
              "every window filtered")  # fmt: skip
        sink = next(e.id for e in spec.elements if e.kind == "csv-sink")
        _wait(client, pipeline, sink, len(expected), deadline, console, "every alarm")
        # The samples of the whole windows the source sends (a recording's last part
        # window is not sent: 29,925 of 30,000 samples at 0.7 s windows).
        window, per_patient = layout(source.sampling_rate, source.window_s, source.duration_s)
        total = window * per_patient
        taken = _taken(client, pipeline, parts.classifier, dict.fromkeys(names, total), deadline,
                       console)  # fmt: skip
        time.sleep(1.0)  # a duplicate would show up within a batch or two: give it the chance
        after = _element(client, pipeline, origin.id)
        twin = client.get(f"/pipelines/{pipeline}/elements/{parts.classifier}/state",
                          params={"key": walker})  # fmt: skip
        kept = client.get(f"/pipelines/{pipeline}/elements/{origin.id}/state")
        dead = sum(e["dead_letters"] for e in client.get(f"/pipelines/{pipeline}")["elements"])
    alarms = read_alarms(parts.alarms)
    problems = [
        f"{who}: alarms {mine} differ from the reference's {want}"
        for who in names
        if (mine := [(t, c) for p, t, c in alarms if p == who])
        != (want := [(t, c) for p, t, c in expected if p == who])
    ]  # fmt: skip
    if sorted(alarms) != sorted(expected):
        problems.append(f"{len(alarms)} alarms, the reference has {len(expected)}")
    if taken != dict.fromkeys(names, total):
        problems.append(f"samples each twin took in {taken}, expected {total} each")
    if (twin["element"], twin["node"]) != (report["target_partition"], target.node):
        problems.append(
            f"{walker}'s twin is read at {twin['element']}@{twin['node']}, not at "
            f"{report['target_partition']}@{target.node}"
        )
    held = sorted(e["key"] for e in kept["entries"])
    if held != stay:
        problems.append(f"{origin.id} holds the twins of {held}, expected {stay}")
    if (after["epoch"], after["restarts"], after["node"]) != (
        before["epoch"], before["restarts"], origin.node
    ):  # fmt: skip
        problems.append(
            f"{origin.id} was restarted or moved (epoch {before['epoch']} -> {after['epoch']}, "
            f"restarts {before['restarts']} -> {after['restarts']}, node {after['node']})"
        )
    if dead:
        problems.append(f"{dead} dead letters (the simulated signal has no bad event)")
    if problems:
        console.print("[red]INCONSISTENT[/]: " + "; ".join(problems))
    else:
        console.print(
            f"[green]CONSISTENT[/]: {len(alarms)} alarms of {len(names)} patients equal the "
            f"reference's, each patient's in order; every twin took in all {total} samples of "
            f"its recording once; {walker}'s twin runs in {twin['element']} on {twin['node']}, "
            f"and {origin.id} on {origin.node} classified "
            + (", ".join(stay) if stay else "nobody else")
            + f" on without a restart (epoch {after['epoch']})"
        )
    detected = _detected(console, alarms, people, source.duration_s)
    return not problems and detected


def check_ecg(spec: PipelineSpec) -> Case2Parts:
    """``spec``'s parts if :func:`run_ecg` can run it (before a cluster starts for it).

    Raises:
        InvalidInput: Not Case 2, or its classifier partitioned (``--case twins``).
    """
    parts = case2_parts(spec)
    if spec.partitions_of(parts.classifier):
        raise InvalidInput(
            f"pipeline {spec.pipeline!r}: its classifier {parts.classifier!r} is partitioned",
            expected="one classifier, which moves with the band-pass as one group",
            received=", ".join(f"{e.id}@{e.node}" for e in spec.partitions_of(parts.classifier)),
            hint="`fogshift demo --case twins` runs a partitioned classifier",
        )
    return parts


def check_twins(spec: PipelineSpec) -> tuple[Case2Parts, list[ElementSpec]]:
    """``spec``'s parts and its classifier's partitions (in order) if :func:`run_twins` can
    run it (before a cluster starts for it).

    Raises:
        InvalidInput: Not Case 2, or its classifier not split over two gateways or more.
    """
    parts = case2_parts(spec)
    return parts, _partitions(spec, parts.classifier)


def _partitions(spec: PipelineSpec, classifier: str) -> list[ElementSpec]:
    """The classifier's partitions, in order; refused unless on two gateways or more."""
    parted = spec.partitions_of(classifier)
    if len({e.node for e in parted}) < 2:
        raise InvalidInput(
            f"pipeline {spec.pipeline!r}: its classifier {classifier!r} is not split over gateways",
            expected="classify with partitions on two nodes or more (partitions: [A, B])",
            received=", ".join(f"{e.id}@{e.node}" for e in parted) or "one classifier",
            hint="start from examples/case2/case2-twins.yaml",
        )
    return parted


def _taken(
    client: ServiceClient,
    pipeline: str,
    classifier: str,
    expected: dict[str, int],
    deadline: float,
    console: Console,
) -> dict[str, int]:
    """How many samples each twin has taken in (where its rhythm's kept tail starts, plus
    the tail), once that is ``expected`` or at the deadline. The last alarm may come before
    the last windows are classified; each look reads the state stores (a Spark job)."""
    with console.status("waiting for every recording classified to its end"):
        while True:
            twins = client.get(f"/pipelines/{pipeline}/elements/{classifier}/state")
            taken = {
                e["key"]: int(e["state"]["rhythm"]["tail_start"])
                + len(e["state"]["rhythm"]["tail"])
                for e in twins["entries"]
            }
            if taken == expected or time.monotonic() > deadline:
                return taken
            time.sleep(2.0)


def _source_id(spec: PipelineSpec) -> str:
    return next(e.id for e in spec.elements if e.kind == "ecg-source")


def _sent(status: dict, source: str) -> int:
    """How many windows the wearables have sent, by the pipeline's status."""
    return int(next(e for e in status["elements"] if e["element"] == source)["events_out"])


def _element(client: ServiceClient, pipeline: str, element: str) -> dict:
    status = client.get(f"/pipelines/{pipeline}")
    return next(e for e in status["elements"] if e["element"] == element)


def _wait(
    client: ServiceClient,
    pipeline: str,
    element: str,
    count: int,
    deadline: float,
    console: Console,
    what: str,
    field: str = "events_out",
) -> None:
    """Until ``element`` has emitted ``count`` events (a sink: lines; ``field="events_in"``:
    taken in) or the deadline; says how long it waited (on a loaded machine a restored PE's
    catch-up shows there)."""
    started = time.monotonic()
    with console.status(f"waiting for {what} ({element}: {count} events)"):
        while _element(client, pipeline, element)[field] < count:
            if time.monotonic() > deadline:
                console.print(f"[yellow]gave up waiting for {what}[/]")
                return
            time.sleep(0.5)
    console.print(f"[dim]{what} ({element}: {count} events) after "
                  f"{time.monotonic() - started:.1f} s[/]")  # fmt: skip


def _spare(client: ServiceClient, pipeline: str, placed: set[str]) -> str:
    """The first healthy node that hosts none of the pipeline's PEs."""
    status = client.get(f"/pipelines/{pipeline}")
    busy = {e["node"] for e in status["elements"]}
    spare = sorted(n["name"] for n in client.get("/nodes") if n["healthy"])
    free = [n for n in spare if n not in busy]
    if not free:
        # (A bare SystemExit printed the message alone: no code, nothing expected, no hint.)
        raise Unavailable(
            f"the demo has no healthy node without a PE of {pipeline} to move its processing to",
            expected="a healthy node that hosts none of the pipeline's PEs",
            received="healthy nodes " + (", ".join(spare) or "none") + ", each hosting one",
            hint="`fogshift nodes --home HOME` shows which node is not healthy; run the demo "
            "again once every node of its cluster is",
        )
    return free[0]


def _move(
    client: ServiceClient, pipeline: str, parts: Case2Parts, target: str, console: Console
) -> bool:
    # Make-before-break: each target runs live beside its origin (under the next epoch)
    # before the origin is cut off, so the patients' windows never wait for a pause.
    report = client.post(
        f"/pipelines/{pipeline}/migrate",
        json={"elements": list(parts.processing), "target": target, "mode": "handover"},
    )
    for one in report["migrations"]:
        downtime = one["downtime_ms"]
        console.print(
            f"  {one['element']}: {one['origin']} -> {one['target']} {one['status']}, downtime "
            + ("-" if downtime is None else f"{downtime:.0f} ms")
            + f", state {one['state_bytes']} bytes"
        )
    if report["status"] != "migrated":
        console.print(f"[red]the group migration ended {report['status']}[/]: {report}")
        return False
    return True


def _flow(client: ServiceClient, spec: PipelineSpec, parts: Case2Parts, during: str) -> str:
    """``during`` and how far the wearables are, or that their recordings have ended: the
    moment is the machine's to decide (the recordings stream at their own pace)."""
    sent = _sent(client.get(f"/pipelines/{spec.pipeline}"), _source_id(spec))
    if sent < parts.windows:
        return f"{during} (window {sent} of {parts.windows})"
    return "after the wearables' recordings ended"


def _restored(
    client: ServiceClient,
    spec: PipelineSpec,
    parts: Case2Parts,
    killed: str,
    deadline: float,
    console: Console,
) -> bool:
    """Until each processing PE is restored away from ``killed``; prints the reports."""
    pipeline = spec.pipeline
    before = {e: _element(client, pipeline, e)["epoch"] or 0 for e in parts.processing}
    if not spec.recovery.auto:
        for element in parts.processing:
            client.post(f"/pipelines/{pipeline}/elements/{element}/restore", json={})
    done: dict[str, dict] = {}
    with console.status(
        f"the orchestrator restores {', '.join(parts.processing)} once {killed} has been "
        f"silent {spec.recovery.detect_after_s:g} s"
    ):
        while len(done) < len(parts.processing) and time.monotonic() < deadline:
            for e in client.get(f"/pipelines/{pipeline}")["elements"]:
                report = e.get("last_restore")
                if (
                    e["element"] in parts.processing
                    and e["node"] != killed
                    and report is not None
                    and report["status"] == "restored"
                    and report["epoch"] > before[e["element"]]
                ):
                    done.setdefault(e["element"], report)
            time.sleep(0.5)
    for element in parts.processing:
        report = done.get(element)
        if report is None:
            console.print(f"[red]{element} was not restored in time[/]")
            return False
        console.print(
            f"restored [bold]{element}[/] on {report['target']} (epoch {report['epoch']}) from "
            f"its {report['checkpoint_source']} checkpoint: reprocessed "
            f"{report['reprocessed_events']} events without emitting, then "
            f"{report['intermediate_events']} intermediate; total {report['total_ms']:.0f} ms"
        )
    return True


def _filtered(client: ServiceClient, pipeline: str, bandpass: str) -> dict[str, list[float]]:
    """Each patient's filtered samples, in stream order, read page by page from the
    band-pass's output stream through the orchestrator."""
    out: dict[str, list[float]] = {}
    after = 0
    while True:
        page = client.get(
            f"/pipelines/{pipeline}/elements/{bandpass}/events",
            params={"after": after, "limit": PAGE},
        )
        for event in page["events"]:
            body = event["body"]
            out.setdefault(str(body["patient"]), []).extend(body["samples"])
        after = page["scanned_to"]
        if after >= page["last_seq"]:
            return out


def _compare_filtered(
    filtered: dict[str, list[float]], reference: dict[str, np.ndarray]
) -> list[str]:
    problems = []
    if sorted(filtered) != sorted(reference):
        problems.append(f"patients {sorted(filtered)}, expected {sorted(reference)}")
    for patient, signal_ in reference.items():
        got = np.asarray(filtered.get(patient, []))
        if len(got) != len(signal_):
            problems.append(f"{patient}: {len(got)} filtered samples, {len(signal_)} expected")
        elif not np.array_equal(got, signal_):
            first = int(np.flatnonzero(got != signal_)[0])
            problems.append(f"{patient}: sample {first} differs ({got[first]} != {signal_[first]})")
    return problems
