"""Running a processor over one micro-batch of events: the part shared by every processor.

Input rows are ``(origin, seq, timestamp, creator, body)`` (see
``fogshift.broker.datasource.EVENT_SCHEMA``); output rows follow ``RECORD_SCHEMA``.

**Per-event isolation.** Whatever one event does — its body is not JSON, ``process()`` raises
any exception, an output JSON cannot hold (a non-finite number, a set), an output over the
record size limit — that event becomes a dead letter with the reason, the batch goes on, and
the processor's state is as if the event had never arrived. Any exception means any
``BaseException``: ``SystemExit`` (user or library code calling ``sys.exit()`` on a bad input
failed the batch at every retry), ``GeneratorExit``, ``KeyboardInterrupt``,
``asyncio.CancelledError``, a ``BaseExceptionGroup``, a class of the processor's own (a
Spark Python worker runs in its node's own session, where no terminal's ^C reaches: such an
exception is the processor's). Only a processor that cannot be built at all
(:class:`~fogshift.runtime.exceptions.ElementError`: nothing an event did), and whatever the
caller's own ``SIGALRM`` handler raises (see :class:`_Deadline`), end the batch.
A ``DeadLetter`` with no reason (``""``, ``None``) is dead-lettered with one that says so
and where it was raised.

**An event that kills its worker** (``os._exit()``, a crash in native code, the OOM
killer) cannot be caught here: the worker's mark names it while ``process()`` runs, the
agent blames it after the crash, and once it killed its worker twice it is *condemned*: a
dead letter without being processed (:mod:`fogshift.runtime.crashes`).

**A stuck event.** ``process()`` (its outputs iterated and encoded too) has
``event_timeout_s`` for one event; past it the event is a dead letter like any other
failure, and its state changes are undone. The bound is a ``SIGALRM`` timer armed around
each event (:class:`_Deadline`), so it also interrupts a ``sleep`` and most blocking calls,
and it raises a ``BaseException`` that a processor's own ``except Exception`` does not
swallow (it is raised again every second until it escapes; a processor that catches
``BaseException`` every time is not stopped here, and one that catches it and returns has
its event processed). Signals reach the main thread only: in any other thread there is no
bound (Spark's Python workers run processors in their main thread). Code that never
returns to the interpreter (a C extension's loop) is not interrupted either; such a worker,
or one that swallows the alarm every time, is killed by its agent later (see above). The
encoding of the outputs is timed with the event because the user's code runs there too (a
body that is a ``Mapping`` of its own, an ``Event`` whose ``seq`` is an object with
``__int__``). An instance that goes on after such an event (a stateless or keyed PE's)
keeps whatever it holds besides its declared state as the interruption left it. A
``SIGALRM`` timer the caller had armed (pytest-timeout's, say) keeps its deadline: its
handler runs when it is due, in the batch too.

State is undone without copying it before every event: on a failure at event *k* the
processor is rebuilt from the last *known-good* state (at first the batch's starting state,
as stored), the events since then are run again silently (their outputs are already
collected; processors are deterministic), *k* is skipped, and the state at that point becomes
the new known-good one — so several failures in one batch cost one replay each, not a
replay from the start. An event after which the state can no longer be encoded is found the
same way (by bisection) and dead-lettered. Stateless processors (no declared state, see
:mod:`fogshift.runtime.api`) have nothing to undo: they just skip the event.
"""

from __future__ import annotations

import itertools
import json
import math
import os
import signal
import sysconfig
import threading
import time
import traceback
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager, suppress
from functools import partial
from operator import itemgetter
from pathlib import Path
from types import FrameType
from typing import Any, Generic, TypeVar

from fogshift.events import (
    DEFAULT_EVENT_TIMEOUT_S,
    DEFAULT_MAX_RECORD_BYTES,
    NOT_AN_EVENT,
    NOT_AN_EVENT_WHY,
    Event,
    dump_body,
    fit_dead_letter,
    load_body,
    oversize,
)
from fogshift.runtime.api import ProcessingElement, Processor, encode_state
from fogshift.runtime.crashes import NO_WATCH, Watch
from fogshift.runtime.exceptions import DeadLetter, ElementError

RECORD_COLUMNS = ["origin", "idx", "seq", "timestamp", "creator", "body", "dead"]

#: One input row: ``(origin, seq, timestamp, creator, body)``.
InputRow = tuple[int, int, float, str, str]
#: The input columns, in :data:`InputRow`'s order.
INPUT_COLUMNS = ("origin", "seq", "timestamp", "creator", "body")
#: One output row: ``(origin, idx, seq, timestamp, creator, body, dead)``.
RecordRow = tuple[int, int, int, float, str, str, str | None]
#: Builds the processor with a resume state (``None``: fresh), like ``Processor.build``.
Builder = Callable[[Mapping[str, Any] | None], Processor]

T = TypeVar("T")

_LONG_MAX = 2**63 - 1
#: The most outputs one event may have, and their most bytes in all (encoded): each
#: record is limited (``max_record_bytes``), but one event returning millions, or a
#: thousand of a MiB each, was copied on into pandas, Arrow and the JVM whole, and a
#: worker or JVM out of memory blames no event (the PE restarted for ever, on every node
#: it was restored to).
MAX_EVENT_OUTPUTS = 100_000
MAX_EVENT_OUTPUT_BYTES = 64 * 1024 * 1024


def _describe(exc: BaseException) -> str:
    """``Type: message`` of an exception, even one whose ``__str__`` raises."""
    try:
        text = str(exc)
    except BaseException as failure:  # a user exception class whose __str__ raises (or exits)
        if ends_batch(failure):
            raise
        text = "<unprintable>"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


#: Code that is not a processor's: fogshift's own, the standard library's (and installed
#: packages', by their folder's name). Where an exception came from is said as the
#: innermost frame outside them.
_NOT_USER_CODE = tuple(
    str(Path(folder).resolve()) + os.sep
    for folder in (
        Path(__file__).resolve().parents[1],  # the fogshift package
        sysconfig.get_paths()["stdlib"],
        sysconfig.get_paths()["platstdlib"],
    )
)


def raised_at(exc: BaseException) -> str:
    """``Type: message (at file.py:12 in process)``: :func:`_describe` and where in the
    processor's code the exception came from (the innermost frame of neither fogshift, the
    standard library nor an installed package; none, as for a built-in kind: nothing
    more). A dead letter's reason said what was raised, never where."""
    user = [f for f in traceback.extract_tb(exc.__traceback__) if not _library(f.filename)]
    if not user:
        return _describe(exc)
    at = user[-1]
    return f"{_describe(exc)} (at {Path(at.filename).name}:{at.lineno} in {at.name})"


def _library(filename: str) -> bool:
    path = Path(filename).resolve()
    return str(path).startswith(_NOT_USER_CODE) or "site-packages" in path.parts


class _EventTimedOut(BaseException):
    """Raised into ``process()`` when its event is over its time (a ``BaseException``: a
    processor's ``except Exception`` must not swallow it)."""


#: The attribute that marks what a caller's own alarm handler raised inside a batch.
_CALLERS = "_fogshift_ends_batch"


def ends_batch(exc: BaseException) -> bool:
    """Whether ``exc`` ends the batch instead of being one event's failure: the event's own
    time limit (made its dead letter by its own clause, around the event), and whatever the
    caller's own alarm handler raised (pytest-timeout's, say: see :class:`_Deadline`).

    Whatever else user code raises for one event — any :class:`Exception`, ``sys.exit()``, a
    generator closed inside it, ``KeyboardInterrupt``, ``asyncio.CancelledError``, a
    ``BaseExceptionGroup``, a ``BaseException`` of its own — makes that event a dead letter:
    every handler of an event's failure catches ``BaseException`` and raises again what
    this says. (Only ``Exception``, ``SystemExit`` and ``GeneratorExit`` were caught: a
    ``CancelledError`` or ``KeyboardInterrupt`` from one event failed its PE for good, a
    review found.)"""
    # (By its real type: isinstance reads `__class__`, which an exception class of the
    # processor's own may make raise — as any attribute, vars() included.)
    if issubclass(type(exc), _EventTimedOut):
        return True
    try:
        return bool(vars(exc).get(_CALLERS, False))
    except BaseException:
        return False


#: Once the first alarm went unheeded (a processor caught it), it is raised again this often.
_ALARM_REPEAT_S = 1.0


class _Deadline:
    """The time limit of each event of one batch: see the module docstring.

    Use :meth:`batch` around the batch (it takes ``SIGALRM`` and gives it back), and
    :meth:`start` and :meth:`stop` around each ``process()`` call (plain calls, not a
    context manager: they run once per event). Inactive (no bound) when ``seconds`` is
    ``None`` or the batch does not run in the main thread.

    A ``SIGALRM`` timer the caller had armed keeps its deadline: between events it is armed
    as it was, during one it is armed at the sooner of the two, and when it is due the
    caller's handler runs (a test's timeout still fires inside a batch).
    """

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.active = False
        self.timing = False
        self._previous: Any = None
        self._caller_due: float | None = None
        self._caller_every = 0.0

    @contextmanager
    def batch(self) -> Iterator[_Deadline]:
        if not self.seconds or threading.current_thread() is not threading.main_thread():
            yield self
            return
        # The caller's timer off first: its alarm must not meet this batch's handler.
        left, self._caller_every = signal.setitimer(signal.ITIMER_REAL, 0)
        self._caller_due = time.monotonic() + left if left > 0 else None
        self._previous = signal.signal(signal.SIGALRM, self._on_alarm)
        self.active = True
        try:
            self.stop()  # (only the caller's timer, if any)
            yield self
        finally:
            self.active = self.timing = False
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)
            if self._caller_due is not None:  # what is left of it (at once if spent)
                left = max(self._caller_due - time.monotonic(), 1e-3)
                signal.setitimer(signal.ITIMER_REAL, left, self._caller_every)

    def _on_alarm(self, signum: int, frame: FrameType | None) -> None:
        due = self._caller_due
        if due is not None and time.monotonic() >= due - 1e-3:
            every = self._caller_every
            self._caller_due = time.monotonic() + every if every > 0 else None
            self._arm(self.seconds if self.timing else None)
            if callable(self._previous):
                try:
                    self._previous(signum, frame)
                except BaseException as exc:
                    # (The caller's, not the event's: it must end the batch, whatever
                    # its type. One that takes no attribute is caught as the event's.)
                    with suppress(AttributeError, TypeError):
                        setattr(exc, _CALLERS, True)
                    raise
            return
        if self.timing:
            raise _EventTimedOut

    def _arm(self, seconds: float | None) -> None:
        """Arm the timer for ``seconds`` (``None``: only the caller's deadline, if any)."""
        due = self._caller_due
        caller = None if due is None else max(due - time.monotonic(), 1e-3)
        first = min((t for t in (seconds, caller) if t is not None), default=0.0)
        repeat = _ALARM_REPEAT_S if seconds is not None else 0.0
        signal.setitimer(signal.ITIMER_REAL, first, repeat)

    def start(self) -> None:
        """Arm the time of one event. :class:`_EventTimedOut` is raised wherever the code
        then is once it is over: catch it around the event and the :meth:`stop` after it
        (the alarm may fire as the event ends, before the stop disarms it)."""
        if self.active:
            self.timing = True
            if self._caller_due is None:  # (the common case, once per event: one call)
                signal.setitimer(signal.ITIMER_REAL, self.seconds or 0.0, _ALARM_REPEAT_S)
            else:
                self._arm(self.seconds)

    def stop(self) -> None:
        """No more alarms for this event (safe to call at any time, and twice)."""
        if self.active:
            self.timing = False  # first: an alarm from here on raises nothing
            if self._caller_due is None:
                signal.setitimer(signal.ITIMER_REAL, 0)
            else:
                self._arm(None)


#: The deadline of code that runs events outside a batch (none).
_UNBOUNDED = _Deadline(None)


class _Rejected(Exception):
    """One event's failure, with the dead letter's reason.

    Attributes:
        reason: Why the event is a dead letter.
        touched: Whether ``process()`` ran, i.e. the state may have changed.
    """

    def __init__(self, reason: object, touched: bool) -> None:
        text = _as_reason(reason)
        super().__init__(text)
        self.reason = text
        self.touched = touched


def _as_reason(reason: object) -> str:
    """``reason`` as text a dead letter can carry through Arrow and JSON: a processor may
    raise ``DeadLetter`` with anything (an exception, ``None``), and a message may hold a
    lone surrogate (an input's text quoted), which no UTF-8 encoder takes (a batch that
    failed at every retry)."""
    # (By its real type: isinstance reads `__class__`, a user object's own code.)
    if issubclass(type(reason), str):
        text = str.__str__(reason)  # type: ignore[arg-type]
    elif issubclass(type(reason), BaseException):
        text = _describe(reason)  # type: ignore[arg-type]
    else:
        try:
            text = str(reason)
        except BaseException as failure:  # a user object whose __str__ raises (or exits)
            if ends_batch(failure):
                raise
            text = f"<unprintable {type(reason).__name__}>"
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _outputs(pe: str, result: Any) -> list[Any]:
    """The outputs of one ``process()`` call as a list (a generator runs here)."""
    if result is None:
        return []
    if isinstance(result, (Event, Mapping)):
        return [result]
    try:
        # (Taken one past the limit at most: a generator without end is cut here.)
        outputs = list(itertools.islice(result, MAX_EVENT_OUTPUTS + 1))
        if len(outputs) > MAX_EVENT_OUTPUTS:
            raise _Rejected(
                f"processor {pe!r} returned more than {MAX_EVENT_OUTPUTS:,} outputs for one "
                "event, the most one event may have",
                touched=True,
            )
        return outputs
    except (DeadLetter, _Rejected):  # a generator's own DeadLetter: as if process()
        # had raised it (see _call); too many outputs: this event's
        raise
    except BaseException as exc:  # not iterable, or a generator that raised part-way
        if ends_batch(exc):
            raise
        if isinstance(result, Iterator):
            # The processor's own code raised, as a generator runs it here: not a wrong
            # return type (it read "expected None, a dict, ..." of the user's exception).
            raise _Rejected(
                f"processor {pe!r} raised {raised_at(exc)} while its outputs were taken "
                "(a generator runs as they are)",
                touched=True,
            ) from exc
        raise _Rejected(
            f"processor {pe!r} returned {type(result).__name__} and iterating it raised "
            f"{raised_at(exc)}; expected None, a dict, an Event or an iterable of those",
            touched=True,
        ) from exc


def _encode(
    pe: str, event: Event, outputs: Sequence[Any], limit: int
) -> list[tuple[int, float, str]]:
    """``(seq, timestamp, body_json)`` of each output.

    Raises:
        _Rejected: An output is not a body or an Event, has a header the schema cannot
            hold, a body JSON cannot hold, or is over ``limit`` bytes encoded.
    """
    encoded = []
    body: Mapping[str, Any]
    total = 0
    for n, out in enumerate(outputs):
        try:
            # (isinstance reads `__class__` of an object not exactly a dict or an Event:
            # the processor's own code, which may raise anything.)
            accepted = isinstance(out, (Event, Mapping))
        except BaseException as exc:
            if ends_batch(exc):
                raise
            accepted = False
        if not accepted:
            raise _Rejected(
                f"processor {pe!r} returned output {n} of type {type(out).__name__}; "
                "expected a dict (a body) or an Event",
                touched=True,
            )
        try:
            # (An Event of the processor's own runs its code as its fields are read.)
            if isinstance(out, Event):
                seq, timestamp, body = out.seq, out.timestamp, out.body
            else:
                seq, timestamp, body = event.seq, event.timestamp, out
            seq, timestamp = int(seq), float(timestamp)
            # (0 up: a reader takes a negative seq for a stranger's message, not an event)
            if not (0 <= seq <= _LONG_MAX and math.isfinite(timestamp)):
                raise ValueError(f"seq {seq!r} or timestamp {timestamp!r} is out of range")
            text = dump_body(dict(body))
        except BaseException as exc:  # what the encoding refuses, whatever the type (a
            if ends_batch(exc):
                raise
            # mapping or number of the processor's own runs its code here: its sys.exit()
            # is its event's failure, as in process())
            raise _Rejected(
                f"processor {pe!r} returned output {n} that cannot be encoded "
                f"({_describe(exc)}); bodies hold JSON values and finite numbers only",
                touched=True,
            ) from exc
        size = oversize(seq, timestamp, pe, text, None, limit)
        if size is not None:
            raise _Rejected(
                f"processor {pe!r} returned output {n} of {size} bytes encoded, over the "
                f"limit of {limit} bytes (max_record_bytes)",
                touched=True,
            )
        total += len(text)  # (ASCII: JSON escapes the rest)
        if total > MAX_EVENT_OUTPUT_BYTES:
            raise _Rejected(
                f"processor {pe!r} returned outputs of over {MAX_EVENT_OUTPUT_BYTES:,} bytes "
                f"encoded in all for one event (at output {n}), the most one event may have",
                touched=True,
            )
        encoded.append((seq, timestamp, text))
    return encoded


def _event(pe: str, row: InputRow) -> Event:
    """The event of an input row.

    Raises:
        _Rejected: The row is not an event (``process()`` never sees it).
    """
    _, seq, timestamp, creator, body_text = row
    if creator == NOT_AN_EVENT:  # (its body is the message's raw text: see event_fields)
        raise _Rejected(
            f"input of {pe!r} is not an event: {NOT_AN_EVENT_WHY}",
            False,
        )
    try:
        return Event(int(seq), float(timestamp), str(creator), load_body(body_text))
    except Exception as exc:  # whatever is wrong with the input, it changed no state
        raise _Rejected(f"input of {pe!r} is not an event: {_describe(exc)}", False) from exc


def _call(
    processor: Processor,
    pe: str,
    event: Event,
    deadline: _Deadline = _UNBOUNDED,
    limit: int | None = None,
) -> list[Any]:
    """``process(event)``'s outputs as a list, within ``deadline``'s time for one event;
    encoded by :func:`_encode` (``limit``: ``max_record_bytes``) unless ``limit`` is ``None``.

    The encoding is timed with the event: the user's code runs there too (a body that is a
    ``Mapping`` of its own, a ``dict`` subclass inside one, an ``Event`` whose ``seq`` is an
    object with ``__int__``), and stuck there it would hold the PE for good.

    Raises:
        _Rejected: ``process()`` raised (any :class:`Exception`), returned no outputs or
            outputs that cannot be encoded, or was over its time.
    """
    try:
        deadline.start()
        try:
            try:
                outputs = _outputs(pe, processor.process(event))  # (a generator runs here)
            except _Rejected:
                raise
            except DeadLetter as exc:
                # (A subclass whose __init__ set no reason: its message, not an
                # AttributeError that failed the batch at every retry.)
                try:
                    reason = getattr(exc, "reason", exc)
                except BaseException as failure:  # (a subclass's property that raises)
                    if ends_batch(failure):
                        raise
                    reason = exc
                touched = not processor.dead_letters_change_nothing
                if reason is None or not _as_reason(reason).strip():
                    # (A dead letter read "" or "None": no reason at all.)
                    reason = f"processor {pe!r} raised {raised_at(exc)} and gave no reason"
                raise _Rejected(reason, touched=touched) from exc
            except BaseException as exc:
                if ends_batch(exc):
                    raise
                raise _Rejected(f"processor {pe!r} raised {raised_at(exc)}", True) from exc
            return outputs if limit is None else _encode(pe, event, outputs, limit)
        finally:
            deadline.stop()
    except _EventTimedOut as exc:
        deadline.stop()
        raise _Rejected(
            f"processor {pe!r} took longer than {deadline.seconds:g} s for one event "
            "(event_timeout_s: raise it in the element's spec if its events need longer)",
            touched=True,
        ) from exc


def _process(
    processor: Processor,
    pe: str,
    row: InputRow,
    limit: int,
    deadline: _Deadline = _UNBOUNDED,
    watch: Watch = NO_WATCH,
) -> list[tuple[int, float, str]]:
    """Run one input row through ``processor``; its encoded outputs.

    Raises:
        _Rejected: The event is a dead letter (also when ``watch`` says it is condemned:
            it killed its worker before, :mod:`fogshift.runtime.crashes`).
    """
    condemned = watch.condemned(row)
    if condemned is not None:
        raise _Rejected(condemned, touched=False)
    event = _event(pe, row)
    # The worker's mark names the event while anything of it runs, all of it timed:
    # process(), iterating its outputs and encoding them.
    watch.enter(row)
    try:
        return _call(processor, pe, event, deadline, limit)
    finally:
        watch.leave()


def dead_letter(row: InputRow, pe: str, reason: str, limit: int) -> RecordRow:
    origin, seq, timestamp, _, body_text = row
    # (A reason quoting an input's text may hold a lone surrogate, which Arrow refuses.)
    text = _as_reason(reason)
    body, reason = fit_dead_letter(int(seq), float(timestamp), pe, str(body_text), text, limit)
    return (origin, 0, seq, timestamp, pe, body, reason)


def unkeyed_dead_letters(
    rows: Iterable[InputRow], pe: str, key_by: str, limit: int = DEFAULT_MAX_RECORD_BYTES
) -> list[RecordRow]:
    """Dead letters for input rows of a keyed PE that have no key: their body is not an
    event, or its ``key_by`` field is missing or null. No state is involved: such an event
    belongs to no key's state."""
    out = []
    for row in rows:
        try:
            event = _event(pe, row)
        except _Rejected as rejected:
            out.append(dead_letter(row, pe, rejected.reason, limit))
            continue
        out.append(dead_letter(row, pe, no_key_reason(pe, key_by, event.body), limit))
    return out


def no_key_reason(pe: str, key_by: str, body: Mapping[str, Any]) -> str:
    """Why an event whose body is ``body`` has no key to Spark (which found none): its field
    is missing or null, or Spark's JSON reader, which finds the keys, did not read the body
    as JSON does (with Jackson's limits: an event it read otherwise was said to have no
    ``key_by`` field, a review found). The JVM engine says the same (``noKeyReason``)."""
    if body.get(key_by) is None:
        return f"field {key_by!r} (key_by of {pe!r}) is missing or null: the event has no key"
    return (
        f"field {key_by!r} (key_by of {pe!r}) is in the event, but Spark's JSON reader, which "
        "finds the keys, does not read its body as JSON does (NaN, a lone surrogate, a number "
        "of over 1,000 digits or a name of over 50,000 characters in it, or the field "
        "repeated): the event has no key"
    )


def input_rows(frames: Iterable[Any]) -> list[InputRow]:
    """The rows of ``frames`` (Spark's pandas frames of one key, or of one Arrow batch) as
    tuples of plain Python values, in input order (by ``origin``; a stable sort).

    Not through pandas (``concat``, ``sort_values``, a column selection, ``itertuples``):
    that took ~1.1 ms a call here, paid for every key in every batch of a keyed PE (1,000
    keys: over a second a batch), against ~16 µs for a key's handful of rows this way."""
    rows: list[InputRow] = []
    for frame in frames:
        rows.extend(zip(*(frame[column].tolist() for column in INPUT_COLUMNS), strict=True))
    rows.sort(key=itemgetter(0))
    return rows


def split_refused(
    rows: Iterable[InputRow],
    pe: str,
    why: Callable[[InputRow], str | None],
    limit: int = DEFAULT_MAX_RECORD_BYTES,
) -> tuple[list[InputRow], list[RecordRow]]:
    """The rows to process, and dead letters for those ``why`` gives a reason to refuse
    (before they meet any state: a refused event changes none)."""
    kept: list[InputRow] = []
    refused: list[RecordRow] = []
    for row in rows:
        reason = why(row)
        if reason is None:
            kept.append(row)
        else:
            refused.append(dead_letter(row, pe, reason, limit))
    return kept, refused


class _ReplayFailed(Exception):
    """A live event raised when run again: it is the culprit (see ``_Batch._replay``)."""

    def __init__(self, index: int, reason: str) -> None:
        super().__init__(reason)
        self.index, self.reason = index, reason


class _Batch(Generic[T]):
    """One batch of a stateful processor; see the module docstring and :func:`run_batch`.

    Invariants: ``results[i]`` holds event *i*'s records once it ran (``None``: not run, or
    forgotten because an earlier event was found to have spoilt the state it ran on);
    ``dead`` maps the dead-lettered events to their reasons; ``good_state()`` returns the
    state after every live event before ``good_at``, and that state can be encoded.
    """

    def __init__(
        self,
        build: Builder,
        start_state: Callable[[], Mapping[str, Any] | None],
        rows: Sequence[InputRow],
        finish: Callable[[Processor], T],
        limit: int,
        pe: str,
        pipeline: str,
        live: Processor | None = None,
        deadline: _Deadline = _UNBOUNDED,
        watch: Watch = NO_WATCH,
    ) -> None:
        self.build, self.rows, self.finish, self.limit, self.pe = build, rows, finish, limit, pe
        self.live, self.deadline, self.watch = live, deadline, watch
        #: Names the PE in errors (dead-letter reasons name the PE only: they live in its
        #: pipeline's streams).
        self.who = f"processor {pe!r}" + (f" of pipeline {pipeline!r}" if pipeline else "")
        self.good_at = 0
        self.good_state = start_state
        self.results: list[list[RecordRow] | None] = [None] * len(rows)
        self.dead: dict[int, str] = {}
        #: The row whose failure the replays under way undo (``None``: the state's failure
        #: to be stored): a worker that dies in a replay is blamed on it (those events ran
        #: once already; it did not), see :mod:`fogshift.runtime.crashes`.
        self.undoing: InputRow | None = None

    def _rebuild(self) -> Processor:
        """A processor holding the known-good state.

        Raises:
            ElementError: ``build``/``restore()`` raised: nothing any event did (non-data).
        """
        try:
            return self.build(self.good_state())
        except ElementError:
            raise
        except Exception as exc:
            raise ElementError(
                f"{self.who} cannot be built from its state: {_describe(exc)}",
                hint="its constructor, options and restore() must accept what snapshot() returned",
            ) from exc

    def _run(self, processor: Processor, i: int) -> bool:
        """Run event ``i``; ``False`` if it failed after ``process()`` ran (state to undo)."""
        row = self.rows[i]
        try:
            outputs = _process(processor, self.pe, row, self.limit, self.deadline, self.watch)
        except _Rejected as rejected:
            self._kill(i, rejected.reason)
            return not rejected.touched
        self.results[i] = [
            (row[0], n, seq, ts, self.pe, text, None) for n, (seq, ts, text) in enumerate(outputs)
        ]
        return True

    def _kill(self, i: int, reason: str) -> None:
        self.dead[i] = reason
        self.results[i] = [dead_letter(self.rows[i], self.pe, reason, self.limit)]

    def _replay(self, upto: int) -> Processor:
        """The known-good state plus the live events in ``[good_at, upto)``, run silently.

        Raises:
            _ReplayFailed: A live event raised this time (the processor is not deterministic,
                or its state does not survive a snapshot round trip).
        """
        processor = self._rebuild()
        try:
            for j in range(self.good_at, upto):
                if j in self.dead:
                    continue
                if self.undoing is not None:
                    # (its time anew for each event replayed)
                    self.watch.enter(self.undoing, undoing=True)
                try:
                    # Its outputs are already collected: only the state matters here.
                    _call(processor, self.pe, _event(self.pe, self.rows[j]), self.deadline)
                except _Rejected as rejected:
                    raise _ReplayFailed(j, rejected.reason) from rejected
        finally:
            self.watch.leave()
        return processor

    def _bisect(self, upto: int) -> tuple[int, str]:
        """A live event in ``[good_at, upto)`` after which the state cannot be encoded.

        The known-good state can be encoded and the state at ``upto`` cannot: some event in
        between turned the one into the other. Each probe replays from the known-good state,
        so this costs O(log n) replays — paid only when such an event exists.

        Raises:
            _ReplayFailed: A live event raised when run again.
            ElementError: The state cannot be encoded even before these events.
        """
        live = [j for j in range(self.good_at, upto) if j not in self.dead]
        error = _unencodable(self._rebuild())
        if error is not None or not live:
            raise ElementError(
                f"{self.who} has a state that cannot be encoded ({error or 'whatever its events'})",
                hint="snapshot() must return JSON values and finite numbers only, and "
                "restore() take them back",
            )
        low, high = 0, len(live)  # the state after live[:low] encodes, after live[:high] not
        while high - low > 1:
            mid = (low + high) // 2
            if _unencodable(self._replay(live[mid - 1] + 1)) is None:
                low = mid
            else:
                high = mid
        error = _unencodable(self._replay(live[high - 1] + 1))
        if error is not None and error.startswith("ValueError: its snapshot() raised "):
            # The processor's own code failed, not the encoding ("state holds JSON values
            # and finite numbers only" sent its author looking at the wrong thing).
            return live[high - 1], (
                f"processor {self.pe!r} cannot take a snapshot of its state after this "
                f"event: {error.removeprefix('ValueError: ')}"
            )
        return live[high - 1], (
            f"processor {self.pe!r} was left with a state that cannot be encoded "
            f"({error}); state holds JSON values and finite numbers only"
            + (", and reads back as it is" if "snapshot() returned" in (error or "") else "")
        )

    def _settle(self, upto: int) -> tuple[Processor, bool]:
        """Make the state after the live events before ``upto`` the known-good one.

        If an event in between spoils it (raises when run again, or leaves a state that
        cannot be encoded), that event becomes a dead letter, every event after it is
        forgotten (to be run again), and the known-good state is the one before it.

        Returns:
            A processor holding the new known-good state, and whether a culprit was found.
        """
        found = False
        while True:
            try:
                processor = self._replay(upto)
                text = _state_text(processor)
            except _ReplayFailed as failed:
                culprit, reason = (
                    failed.index,
                    (
                        f"{failed.reason} (when run again to undo another event's changes: is "
                        "the processor deterministic?)"
                    ),
                )
            except ElementError:
                raise
            except Exception:
                try:
                    culprit, reason = self._bisect(upto)
                except _ReplayFailed as failed:
                    culprit, reason = failed.index, failed.reason
            else:
                self.good_at = upto
                self.good_state = partial(json.loads, text)
                return processor, found
            found = True
            self._kill(culprit, reason)
            for j in range(culprit + 1, len(self.rows)):
                self.results[j] = None
                self.dead.pop(j, None)
            upto = culprit

    def run(self) -> tuple[list[RecordRow], T]:
        # An instance that already holds the starting state saves decoding and building it;
        # undoing an event still rebuilds from ``good_state``, never from this instance.
        processor = self.live if self.live is not None else self._rebuild()
        i = 0
        while True:
            while i < len(self.rows):
                if self.results[i] is None and not self._run(processor, i):
                    # The state may hold the failed event's changes: back to the state
                    # before it (the failed event is dead now, so the replay skips it).
                    self.undoing = self.rows[i]
                    processor, _ = self._settle(i)
                    i = self.good_at
                i += 1
            try:
                if _own_state_code(processor):  # (declared fields: see _state_text)
                    _state_text(processor)
                final = self.finish(processor)
                break
            except Exception as exc:
                self.undoing = None
                processor, found = self._settle(len(self.rows))
                if not found:
                    raise ElementError(
                        f"{self.who}: its state cannot be stored "
                        f"({_describe(exc)}), yet no event made it so",
                        hint="snapshot() must return the declared fields as JSON values",
                    ) from exc
                i = self.good_at
        return [record for result in self.results for record in result or ()], final


def _own_state_code(processor: Processor) -> bool:
    """Whether the processor's class has a ``snapshot()`` or a ``restore()`` of its own:
    its state must then be read back where a batch ends (see :func:`_state_text`). A
    ``restore()`` of its own over declared fields (a cache rebuilt from them) could refuse
    a state its fields encode: stored, every rebuild from it failed for good."""
    cls = type(processor)
    return (
        cls.snapshot is not ProcessingElement.snapshot
        or cls.restore is not ProcessingElement.restore
    )


def _state_text(processor: Processor) -> str:
    """The processor's state as it is stored; with a ``snapshot()`` or ``restore()`` of
    its own, read back first: ``restore()`` given it (decoded) must take it, and the
    processor must then store the same text. Declared fields read back by
    :func:`encode_state`'s own check; a snapshot of its own may not (ids written as text
    that ``restore()`` turns into ints, and one event's text id), nor may declared fields
    a ``restore()`` of its own builds on (an index by a field an event lacked): the state
    was stored, and every later rebuild from it (an event undone, a restart, a move)
    failed for good. Afterwards the processor holds the state read back (the same, as
    checked); if the check fails, what it holds is not to be used (the callers rebuild
    from the known-good state).

    Raises:
        ValueError: The state cannot be encoded, or does not read back as it is.
    """
    try:
        state = processor.snapshot()
    except BaseException as exc:
        if ends_batch(exc):
            raise
        # Said as its own (it read as a state that "cannot be encoded").
        raise ValueError(f"its snapshot() raised {raised_at(exc)}") from exc
    text = encode_state(state)
    if _own_state_code(processor):
        try:
            processor.restore(json.loads(text))
            again = encode_state(processor.snapshot())
        except BaseException as exc:
            if ends_batch(exc):
                raise
            raise ValueError(
                f"its restore() refuses what its snapshot() returned ({raised_at(exc)})"
            ) from exc
        if again != text:
            raise ValueError("restored from what its snapshot() returned, it stores another state")
    return text


def _unencodable(processor: Processor) -> str | None:
    """Why the processor's state cannot be stored (:func:`_state_text`), or ``None``."""
    try:
        _state_text(processor)
    except BaseException as exc:  # snapshot() itself may raise, like the encoding
        if ends_batch(exc):
            raise
        return _describe(exc)
    return None


def run_batch(
    build: Builder,
    start_state: Callable[[], Mapping[str, Any] | None],
    rows: Iterable[InputRow],
    *,
    finish: Callable[[Processor], T],
    pe: str,
    pipeline: str = "",
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    live: Processor | None = None,
    event_timeout_s: float | None = DEFAULT_EVENT_TIMEOUT_S,
    watch: Watch = NO_WATCH,
) -> tuple[list[RecordRow], T]:
    """Run one batch of a **stateful** processor with per-event isolation.

    Args:
        build: Builds the processor from a resume state (``Processor.build`` with its
            options and id). Called once (not at all when ``live`` is given), and again
            for each failed event.
        start_state: Returns the batch's starting state, a fresh object on every call (the
            processor may mutate what it is given): e.g. decodes the stored JSON again.
        rows: The batch's input rows, sorted by origin.
        finish: Turns the final processor into what the caller stores (e.g. the encoded
            snapshot); raising means the state cannot be stored, and the event that made it
            so becomes a dead letter.
        pe: The element id (creator of the records, named in reasons).
        pipeline: The pipeline, named in errors.
        max_record_bytes: The largest encoded output record.
        live: An instance that holds exactly ``start_state()`` (e.g. kept from the previous
            batch, see :mod:`fogshift.runtime.instances`): it runs the batch until an event
            has to be undone. ``finish`` then receives it or an instance ``build`` made.
        event_timeout_s: How long ``process()`` may take for one event before the event is
            a dead letter (``None``: no bound; see the module docstring).
        watch: The worker's mark and the PE's condemned events (see
            :mod:`fogshift.runtime.crashes`): each event is marked while it runs, and a
            condemned one is a dead letter without running.

    Returns:
        The output records (events and dead letters, by origin) and ``finish``'s result for
        the state as if every dead-lettered event had never arrived.

    Raises:
        ElementError: The processor cannot be built, or rebuilt from its own snapshot.
    """
    deadline = _Deadline(event_timeout_s)
    watch.refresh()
    batch = _Batch(
        build,
        start_state,
        list(rows),
        finish,
        max_record_bytes,
        pe,
        pipeline,
        live,
        deadline,
        watch,
    )
    with deadline.batch():
        return batch.run()


def run_events(
    processor: Processor,
    rows: Iterable[InputRow],
    *,
    max_record_bytes: int = DEFAULT_MAX_RECORD_BYTES,
    event_timeout_s: float | None = DEFAULT_EVENT_TIMEOUT_S,
    watch: Watch = NO_WATCH,
) -> Iterator[RecordRow]:
    """Feed ``rows`` (sorted by origin) to ``processor``; yield output records.

    An event that cannot be parsed, for which the processor raises or is over
    ``event_timeout_s``, or whose outputs cannot be encoded or are over
    ``max_record_bytes``, becomes a dead letter carrying the input body and the reason;
    processing goes on with the next event. A stateful ``processor`` ends the batch with
    the state as if those events had never arrived (its state is snapshotted once, up front,
    to undo them; the engine uses :func:`run_batch` with the stored state instead). Every
    event has run before the first record is yielded (the time limit's alarm is the
    batch's only while it runs, not while the caller holds this generator). ``watch``: as
    in :func:`run_batch`.
    """
    pe = processor.element_id
    rows = list(rows)
    if not processor.is_stateful():
        watch.refresh()
        records: list[RecordRow] = []
        deadline = _Deadline(event_timeout_s)
        with deadline.batch():
            for row in rows:
                try:
                    outputs = _process(processor, pe, row, max_record_bytes, deadline, watch)
                except _Rejected as rejected:
                    records.append(dead_letter(row, pe, rejected.reason, max_record_bytes))
                    continue
                records.extend(
                    (row[0], n, seq, ts, pe, text, None)
                    for n, (seq, ts, text) in enumerate(outputs)
                )
        yield from records
        return
    start = encode_state(processor.snapshot())

    def build(resume: Mapping[str, Any] | None) -> Processor:
        return type(processor).build(processor.options, pe, resume)

    records, final = run_batch(
        build,
        lambda: json.loads(start),
        rows,
        finish=lambda p: p,
        pe=pe,
        max_record_bytes=max_record_bytes,
        live=processor,  # the caller's instance runs the batch until an event is undone
        event_timeout_s=event_timeout_s,
        watch=watch,
    )
    if final is not processor:
        processor.restore(json.loads(encode_state(final.snapshot())))
    yield from records
