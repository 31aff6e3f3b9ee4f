"""An offline reference of Case 2, and the quality of its alarms against the ground truth.

One process runs what the pipeline runs on three nodes — wearables, amplifier, band-pass,
classifier — over the same simulated recordings: the band-pass over each *whole* recording
at once (``scipy.signal.sosfilt``), not window by window with a carried state as the PE does,
so equal outputs mean the pipeline's filter state survived every window boundary, migration
and restore; the beats, features and network are :mod:`fogshift.ecg`'s (the model is part of
the spec, not of the system under test), the alarm rule is written again here.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from scipy.signal import sosfilt

from fogshift.ecg import beats, dsp
from fogshift.ecg.model import load
from fogshift.ecg.simulate import Patient, layout, patients, recording
from fogshift.exceptions import InvalidInput
from fogshift.spec.kinds import AmplifyOptions, BandpassOptions, ClassifyOptions, EcgSourceOptions
from fogshift.spec.models import ElementSpec, PipelineSpec

#: One alarm: ``(patient, t, class)`` (the confidence is not compared: float formatting).
Alarm = tuple[str, float, str]


@dataclass(frozen=True)
class Quality:
    """How the alarms match the ground truth.

    Attributes:
        sensitivity: Of the patients whose rhythm turned abnormal, the share with an
            ``abnormal`` alarm after the onset.
        specificity: Of the normal stretches (a healthy patient's whole recording, a sick
            one's before the onset), the share without an ``abnormal`` alarm.
        latency_s: Per detected patient, seconds from onset to the first alarm after it.
        cleared: The abnormal patients given a ``normal`` alarm after their onset (the
            simulator keeps them abnormal): a false all-clear, which the two shares above
            do not see.
    """

    sensitivity: float
    specificity: float
    latency_s: dict[str, float]
    cleared: tuple[str, ...] = ()

    def problems(self) -> list[str]:
        """What falls short of a perfect detection, in words (none: perfect)."""
        found = []
        if self.sensitivity < 1.0:
            found.append(f"sensitivity {self.sensitivity:.2f} (an abnormal patient missed)")
        if self.specificity < 1.0:
            found.append(f"specificity {self.specificity:.2f} (an alarm on a normal stretch)")
        if self.cleared:
            found.append("cleared while abnormal: " + ", ".join(self.cleared))
        return found


@dataclass(frozen=True)
class Case2Parts:
    """What a Case 2 spec says that its verdict needs.

    Attributes:
        source: The ``ecg-source``'s options (the patients and their recordings).
        amplify: The ``amplify``'s options.
        band: The ``bandpass``'s options.
        classify: The ``classify``'s options.
        processing: The ids of the amplifier, band-pass and classifier, in that order (what
            runs on a gateway and follows the wearable).
        alarms: The file the alarm sink (a ``csv-sink`` reading the classifier) writes.
    """

    source: EcgSourceOptions
    amplify: AmplifyOptions
    band: BandpassOptions
    classify: ClassifyOptions
    processing: tuple[str, str, str]
    alarms: Path

    @property
    def bandpass(self) -> str:
        return self.processing[1]

    @property
    def classifier(self) -> str:
        return self.processing[2]

    @property
    def windows(self) -> int:
        """Events the source emits in all: windows per patient times patients."""
        source = self.source
        return layout(source.sampling_rate, source.window_s, source.duration_s)[1] * (
            source.patients
        )


def case2_parts(spec: PipelineSpec) -> Case2Parts:
    """The parts of a Case 2 spec: one ``ecg-source``, ``amplify``, ``bandpass`` and
    ``classify`` each, and a ``csv-sink`` of the classifier's alarms. The classifier may be
    partitioned (``examples/case2/case2-twins.yaml``): its partitions count as one, by the id
    the spec gave it (``Case2Parts.classifier``; the other parts are whole).

    Raises:
        InvalidInput: The pipeline is not shaped so.
    """

    def logical(element_id: str) -> str:
        # Only the classifier's partitions count as one: a partitioned band-pass would be
        # no Case 2 the demos know (its partitions would read several inputs downstream).
        part = by_id[element_id].partition
        return part.of if part is not None and by_id[element_id].kind == "classify" else element_id

    by_id = {e.id: e for e in spec.elements}
    by_kind: dict[str, dict[str, ElementSpec]] = {}
    for element in spec.elements:
        by_kind.setdefault(element.kind, {}).setdefault(logical(element.id), element)
    single = {k: next(iter(v.items())) for k, v in by_kind.items() if len(v) == 1}
    needed = ("ecg-source", "amplify", "bandpass", "classify")
    classifier = single["classify"][0] if "classify" in single else None
    sinks = [
        e for e in by_kind.get("csv-sink", {}).values()
        if classifier is not None and any(logical(i) == classifier for i in e.inputs)
    ]  # fmt: skip
    if not all(k in single for k in needed) or len(sinks) != 1:
        raise InvalidInput(
            f"pipeline {spec.pipeline!r} is not a Case 2 pipeline",
            expected="one ecg-source, amplify, bandpass and classify each (the classifier "
            "may be partitioned), and a csv-sink reading the classifier",
            received=", ".join(e.kind for e in spec.elements),
            hint="start from examples/case2/case2.yaml",
        )
    return Case2Parts(
        source=EcgSourceOptions.model_validate(single["ecg-source"][1].options),
        amplify=AmplifyOptions.model_validate(single["amplify"][1].options),
        band=BandpassOptions.model_validate(single["bandpass"][1].options),
        classify=ClassifyOptions.model_validate(single["classify"][1].options),
        processing=(single["amplify"][0], single["bandpass"][0], single["classify"][0]),
        alarms=Path(str(sinks[0].options["path"])),
    )


def reference_filtered(
    source: EcgSourceOptions, amplify: AmplifyOptions, band: BandpassOptions
) -> dict[str, np.ndarray]:
    """Each patient's amplified recording band-passed whole (the windows the source emits)."""
    fs = source.sampling_rate
    window, windows = layout(fs, source.window_s, source.duration_s)
    sos = dsp.design(float(fs), band.low_hz, band.high_hz, band.order)
    out: dict[str, np.ndarray] = {}
    for p in patients(source.patients, source.seed, source.abnormal_every, source.onset_s):
        raw = recording(p, source.duration_s, fs, source.seed)[: windows * window]
        x = raw * (amplify.gain / amplify.calibration.get(p.name, 1.0))
        out[p.name] = sosfilt(sos, x, zi=dsp.initial_state(sos, float(x[0])))[0]
    return out


def reference_alarms(
    source: EcgSourceOptions,
    amplify: AmplifyOptions,
    band: BandpassOptions,
    classify: ClassifyOptions,
) -> list[Alarm]:
    """The alarms of the Case 2 pipeline, in input order (event by event, patients in turn)."""
    model = load()
    fs = source.sampling_rate
    window, windows = layout(fs, source.window_s, source.duration_s)
    filtered = reference_filtered(source, amplify, band)
    people = patients(source.patients, source.seed, source.abnormal_every, source.onset_s)
    rhythm = {p.name: beats.fresh() for p in people}
    streak = dict.fromkeys(rhythm, 0)
    alarm = dict.fromkeys(rhythm, False)
    out: list[Alarm] = []
    for w in range(windows):
        for p in people:
            part = filtered[p.name][w * window : (w + 1) * window]
            rhythm[p.name] = beats.step(rhythm[p.name], part, fs)
            found = beats.features(rhythm[p.name], fs)
            if beats.silent(rhythm[p.name], fs):
                abnormal = True  # (no beat for seconds)
            elif found is None:
                continue
            else:
                abnormal = model.abnormal(found) >= classify.threshold
            before = streak[p.name]
            streak[p.name] = (max(before, 0) + 1) if abnormal else (min(before, 0) - 1)
            if abs(streak[p.name]) >= classify.confirm and abnormal != alarm[p.name]:
                alarm[p.name] = abnormal
                t = alarm_time(w, window, fs)
                out.append((p.name, t, "abnormal" if abnormal else "normal"))
    return out


def alarm_time(w: int, window: int, fs: float) -> float:
    """When an alarm of window ``w`` (``window`` samples each) is: the window's end as the
    classifier gives it, its start as the source sends it (to the µs) plus its length, to the
    ms. (``(w + 1) * window / fs`` differed by a ms on some windows: 4.812 for the 4.813 of
    window 7 at 256 Hz and 0.6 s windows, and a correct run was judged inconsistent.)"""
    return round(round(w * window / fs, 6) + window / fs, 3)


def read_alarms(path: str | Path) -> list[Alarm]:
    """The alarms a csv-sink wrote (columns ``patient, t, class``)."""
    target = Path(path)
    if not target.exists() or target.stat().st_size == 0:
        return []
    with target.open(newline="") as handle:
        return [(r["patient"], float(r["t"]), r["class"]) for r in csv.DictReader(handle)]


def quality(alarms: list[Alarm], people: list[Patient], duration_s: float | None = None) -> Quality:
    """Sensitivity, specificity and latency of ``alarms`` against the ground truth of a
    recording of ``duration_s``: a patient whose onset is not before its end never turned
    abnormal (the simulator keeps them normal), and is not counted as a missed one."""
    sick = [p for p in people if p.onset_s is not None
            and (duration_s is None or p.onset_s < duration_s)]  # fmt: skip
    raised = [(who, t) for who, t, cls in alarms if cls == "abnormal"]
    latency: dict[str, float] = {}
    for p in sick:
        after = [t for who, t in raised if who == p.name and t >= (p.onset_s or 0)]
        if after:
            latency[p.name] = round(min(after) - (p.onset_s or 0), 3)
    # (who, end of its normal stretch)
    stretches = [(p.name, p.onset_s if p in sick else None) for p in people]
    false = {who for who, t in raised for name, end in stretches
             if who == name and (end is None or t < end)}  # fmt: skip
    cleared = sorted({who for who, t, cls in alarms for p in sick
                      if cls == "normal" and who == p.name and t >= (p.onset_s or 0)})  # fmt: skip
    return Quality(
        sensitivity=len(latency) / len(sick) if sick else 1.0,
        specificity=1 - len(false) / len(stretches) if stretches else 1.0,
        latency_s=latency,
        cleared=tuple(cleared),
    )
