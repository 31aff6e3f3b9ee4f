r"""CSV files as Spark sources and sinks (Python Data Sources).

``fogshift-csv-source`` reads a CSV file with a header row; data row *k* (1-based) becomes the
event with ``seq = k``. Its offset is ``{"type": "csv-rows", "row": k, "t0": epoch s,
"bytes": b}``: the number of data rows already read, when the source started (with ``rate``,
row *k* becomes available at ``t0 + k / rate``) and where row *k* ends in the file (so that a
re-executed batch reads the same bytes). One record per line (no newlines inside quotes).

Lines end at ``\n`` only (a ``\r`` before it is dropped), in the index that counts them and
in the reader that parses them alike: ``\f``, ``\v``, ``\x1c`` to ``\x1e``, U+0085, U+2028 are
ordinary characters. The last line of the file without its ``\n`` is not a row while the file
grows; once the file has not changed for ``tail_settle_s`` its writer is taken to have
finished, and it is the last row (read once: if the writer then carries on that line, the
rest of it belongs to that row and is not read). A row that is not valid UTF-8, not CSV (a
field over ``csv.field_size_limit``, a lone ``\r``), has the wrong number of columns, or is
over ``max_record_bytes`` as an event becomes a dead letter with the reason.

``fogshift-csv-sink`` appends events to a CSV file exactly once. Next to the file a marker
(``.<name>.fogshift.json``) records the last input position written and the file's length at
that point; it is replaced atomically after the data is fsynced. A re-executed batch is
skipped up to the marker, and bytes past the marker's length (a crash mid-append) are cut.
"""

from __future__ import annotations

import csv
import fcntl
import io
import json
import os
import tempfile
import time
from array import array
from collections.abc import Callable, Collection, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    InputPartition,
    WriterCommitMessage,
)
from pyspark.sql.streaming.datasource import ReadAllAvailable, ReadLimit, ReadMaxRows
from pyspark.sql.types import StructType

from fogshift.broker.client import BrokerAddress, shared_client
from fogshift.broker.datasource import RECORD_SCHEMA
from fogshift.broker.exceptions import FENCED_TOKEN, Fenced
from fogshift.broker.publish import Record, publish_records
from fogshift.common.files import sync_folder
from fogshift.common.gate import read_gate
from fogshift.events import (
    DEFAULT_MAX_RECORD_BYTES,
    NOT_AN_EVENT,
    NOT_AN_EVENT_WHY,
    dump_body,
    fit_dead_letter,
    load_body,
    oversize,
    parse_value,
)
from fogshift.exceptions import InvariantViolation
from fogshift.runtime.exceptions import SinkBusy

ROWS_OFFSET = "csv-rows"
#: How long a sink waits for its output file's lock before its batch fails (and is tried
#: again): the holder may be a frozen instance (SIGSTOPped, its node hung) on the storage
#: both share, which would otherwise hang this one silently, and its restore with it.
LOCK_WAIT_S = 30.0
#: Seconds without a change after which a file's unterminated last line counts as a row.
TAIL_SETTLE_S = 2.0
#: A row handed to the sink: ``(origin, seq, timestamp, body_json)``.
SinkRow = tuple[int, int, float, str]


def _rows(value: dict[str, Any]) -> int:
    if value.get("type") != ROWS_OFFSET:
        raise InvariantViolation(f"not a csv-rows offset: {value!r}")
    return int(value["row"])


#: The most bytes :meth:`LineIndex.refresh` reads at once.
SCAN_BYTES = 8 * 2**20

#: A data row longer than this many times ``max_record_bytes`` is a dead letter unread: no
#: event of it could fit (its cells' JSON is longer than the row but for numbers written
#: with many leading zeros), and reading it as CSV costs several times its size (a line of
#: commas ~9x: a worker's OOM at a few hundred MB).
ROW_READ_FACTOR = 8


class LineIndex:
    r"""Byte offsets of the lines of an append-only file, scanned on from where it stopped.

    A line ends with ``b"\n"``. The bytes after the last one (the *tail*) are a line only once
    the file has not changed for ``settle_s`` seconds (its writer finished without a final
    newline); until then they may be half a line.

    Bounded: it holds the lines from :attr:`keep_from` (the reader's read position) up to
    what a batch can ask for, 8 bytes each — every line's start from byte 0 on, kept as
    Python ints, grew ~40 bytes a line for the query's life (a file appended at 1,000 rows/s
    cost GBs a day), and a new reader scanned the whole file again (:meth:`resume_at`).

    Args:
        path: The file.
        settle_s: Quiet time after which the tail counts.
    """

    def __init__(self, path: str, settle_s: float = TAIL_SETTLE_S) -> None:
        self.path = path
        self.settle_s = settle_s
        self.size = 0  # bytes scanned
        self.base = 0  # the line starts[0] is the start of (0 = header)
        self.starts = array("q")  # starts[i] = byte offset of whole line base + i
        self.end = 0  # where the tail (or the first line not scanned) begins
        self.mtime = 0.0
        #: Lines before this one are never asked for again (read and planned past).
        self.keep_from = 0
        #: The file's (device, inode) when first scanned: another file put at its path.
        self.identity: tuple[int, int] | None = None

    def resume_at(self, line: int, byte: int) -> None:
        """Start a new index at line ``line``, which begins at ``byte`` (an offset's
        ``bytes``: where the rows read end): the lines before are never asked for. Left
        as it is (scanned from the start) if anything was scanned yet, or if ``byte``
        does not follow a newline (the rows read ended with a settled tail, whose
        continuation is found by a scan)."""
        if self.size or self.base or line <= 0 or byte <= 0:
            return
        with open(self.path, "rb") as handle:
            handle.seek(byte - 1)
            if handle.read(1) != b"\n":
                return
        self.base = self.keep_from = line
        self.end = self.size = byte

    def read_past(self, line: int) -> None:
        """Lines before ``line`` are never asked for again: their starts go."""
        self.keep_from = max(self.keep_from, line)
        self.forget()

    def forget(self) -> None:
        """Drop the starts of the lines before :attr:`keep_from`."""
        drop = min(self.keep_from - self.base, len(self.starts))
        if drop > 0:
            del self.starts[:drop]
            self.base += drop

    def refresh(self, upto: int | None = None) -> None:
        """Scan what was appended, up to line ``upto``'s end (``None``: the file's end):
        a backlog of millions of rows is not indexed past what a batch can take."""
        stat = os.stat(self.path)
        self.mtime = stat.st_mtime
        identity = (stat.st_dev, stat.st_ino)
        if self.identity is not None and identity != self.identity:
            # (`mv new.csv in.csv`, a rotation: the new file read on from the old one's
            # position, its rows before that skipped and the first one a piece of a line.)
            raise InvariantViolation(
                f"source file {self.path} was replaced by another file while it was read "
                f"(its inode {self.identity[1]} is now {identity[1]})",
                hint="a csv-source reads one file that is only appended to: put the file it "
                "read back, or deploy a pipeline reading the new one",
            )
        self.identity = identity
        if stat.st_size < self.size:
            raise InvariantViolation(
                f"source file {self.path} shrank from {self.size} to {stat.st_size} bytes",
                hint="a csv-source reads a file that is only appended to",
            )
        if stat.st_size == self.size or (upto is not None and self._known(upto)):
            return
        # In pieces of at most SCAN_BYTES: a file appended by gigabytes at once (a backlog
        # copied in) was read whole into the reader's memory to find its line ends.
        line_start, at = self.end, self.end
        with open(self.path, "rb") as handle:
            handle.seek(self.end)
            while at < stat.st_size:
                data = handle.read(min(SCAN_BYTES, stat.st_size - at))
                if not data:
                    break  # (cannot happen to a file only appended to; what was read counts)
                newline = data.find(b"\n")
                while newline != -1:
                    self.starts.append(line_start)
                    line_start = at + newline + 1
                    if upto is not None and self._known(upto):
                        self.end = self.size = line_start
                        return
                    newline = data.find(b"\n", newline + 1)
                at += len(data)
                self.forget()
        self.end = line_start
        self.size = at

    def _known(self, line: int) -> bool:
        """Whether line ``line`` and where it ends were scanned."""
        return self.base + len(self.starts) > line

    @property
    def tail_ready(self) -> bool:
        """Whether the unterminated last line (if any) counts as a line."""
        return self.size > self.end and time.time() - self.mtime >= self.settle_s

    @property
    def lines(self) -> int:
        """Lines scanned, the header included (and the tail if it counts)."""
        return self.base + len(self.starts) + (1 if self.tail_ready else 0)

    @property
    def data_rows(self) -> int:
        return max(0, self.lines - 1)

    def _at(self, line: int) -> int:
        at = line - self.base
        if at < 0:
            raise InvariantViolation(
                f"source file {self.path}: line {line} was asked for, before line "
                f"{self.base}, the first one the reader still knows (it read past it)"
            )
        return at

    def line_end(self, line: int) -> int:
        """Where line ``line`` (0 = header) ends, its newline included; the tail ends at the
        end of the file whether it counts yet or not.

        Raises:
            InvariantViolation: The file has no such line.
        """
        at = self._at(line)
        if at + 1 < len(self.starts):
            return self.starts[at + 1]
        if at + 1 == len(self.starts):
            return self.end
        if at == len(self.starts) and self.size > self.end:
            return self.size
        raise InvariantViolation(f"source file {self.path} has no line {line}")

    def line_start(self, line: int) -> int:
        """Where line ``line`` begins (the tail's start for the line after the last whole one).

        Raises:
            InvariantViolation: The file has no such line.
        """
        at = self._at(line)
        if at < len(self.starts):
            return self.starts[at]
        if at == len(self.starts) and self.size > self.end:
            return self.end
        raise InvariantViolation(f"source file {self.path} has no line {line}")


def _skip_line(handle: Any, left: int) -> tuple[int, bool]:
    """Read on to the end of the line ``handle`` is in, at most ``left`` bytes, in pieces
    of :data:`SCAN_BYTES`: the bytes passed (its newline included), and whether a newline
    ended them."""
    passed = 0
    while passed < left:
        data = handle.read(min(SCAN_BYTES, left - passed))
        if not data:
            break
        newline = data.find(b"\n")
        if newline != -1:
            handle.seek(newline + 1 - len(data), os.SEEK_CUR)
            return passed + newline + 1, True
        passed += len(data)
    return passed, False


class CsvRowsPartition(InputPartition):
    """Data rows ``(start, end]`` of the file and where they are."""

    def __init__(self, start: int, end: int, byte_begin: int, byte_end: int) -> None:
        super().__init__((start, end))
        self.start, self.end = start, end
        self.byte_begin, self.byte_end = byte_begin, byte_end


class CsvSourceDataSource(DataSource):
    """Options: ``path``, ``pe``, ``rate`` (events/s, 0 = unlimited), ``max_events_per_batch``,
    ``gate`` (see :mod:`fogshift.common.gate`)."""

    @classmethod
    def name(cls) -> str:
        return "fogshift-csv-source"

    def schema(self) -> str:
        return RECORD_SCHEMA

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:  # noqa: N802
        return CsvSourceReader(dict(self.options))


class CsvSourceReader(DataSourceStreamReader):
    """Reads a CSV file at a configured rate. Created by Spark, once per query.

    Options (strings): ``path``, ``pe``, ``rate``, ``max_events_per_batch``, ``gate``,
    ``max_record_bytes`` (the largest event, encoded), ``tail_settle_s`` (see
    :class:`LineIndex`).
    """

    def __init__(self, options: dict[str, str]) -> None:
        self.path = options["path"]
        self.pe = options["pe"]
        self.rate = float(options.get("rate", "0"))
        self.max_events = int(options.get("max_events_per_batch", "10000"))
        self.max_record_bytes = int(options.get("max_record_bytes", DEFAULT_MAX_RECORD_BYTES))
        self.gate = options.get("gate")
        self.index = LineIndex(self.path, float(options.get("tail_settle_s", TAIL_SETTLE_S)))

    def initialOffset(self) -> dict:  # noqa: N802
        # ``t0`` anchors the rate schedule in wall-clock time and travels in every offset, so
        # an instance resumed elsewhere (migration, restart) keeps the same schedule instead
        # of starting its own and trailing the original forever.
        return {"type": ROWS_OFFSET, "row": 0, "t0": time.time()}

    def getDefaultReadLimit(self) -> ReadLimit:  # noqa: N802
        return ReadMaxRows(self.max_events)

    def latestOffset(self, start: dict, limit: ReadLimit) -> dict:  # noqa: N802
        begin = _rows(start)
        gate = read_gate(self.gate)
        if gate is not None and gate["mode"] == "hold":
            return start
        self._resume(start)
        self.index.read_past(begin)
        bounded = isinstance(limit, ReadMaxRows) and not isinstance(limit, ReadAllAvailable)
        self.index.refresh(begin + limit.max_rows if bounded else None)  # type: ignore[attr-defined]
        latest = self.index.data_rows
        if latest == begin - 1 and self.index.size > self.index.end:
            latest = begin  # the tail was read as the last row already (it had settled)
        if latest < begin:
            raise InvariantViolation(
                f"source {self.pe!r}: file {self.path} has {latest} data rows but {begin} "
                "were already read",
                hint="a csv-source reads a file that is only appended to",
            )
        t0 = float(start.get("t0", time.time()))
        if self.rate > 0:
            latest = min(latest, int((time.time() - t0) * self.rate))
        if bounded:
            latest = min(latest, begin + limit.max_rows)  # type: ignore[attr-defined]
        if gate is not None and gate["limit"]:
            latest = min(latest, _rows(gate["limit"]))
        if latest <= begin:
            return start
        return {"type": ROWS_OFFSET, "row": latest, "t0": t0, "bytes": self.index.line_end(latest)}

    def partitions(self, start: dict, end: dict) -> Sequence[InputPartition]:
        first, last = _rows(start), _rows(end)
        if last <= first:
            return []
        self._resume(start)
        # (Only from row first + 1 on is asked for: a new reader whose resume was declined
        # indexes no more than a batch either.)
        self.index.read_past(first)
        self.index.refresh(last)
        # Rows before ``first`` were whole lines or the settled tail, whose continuation (if
        # its writer carried on) is skipped with it: the index says where row first+1 begins.
        # The end comes from the offset where there is one, so that a batch re-executed after
        # its last row (a settled tail) grew reads what it read the first time.
        begin = self.index.line_start(first + 1)
        finish = int(end["bytes"]) if "bytes" in end else self.index.line_end(last)
        return [CsvRowsPartition(first, last, begin, finish)]

    def _resume(self, start: dict) -> None:
        """A new reader (the query restarted, the PE moved) indexes the file from where the
        rows read end (``start``'s ``bytes``), not from its first byte."""
        if "bytes" in start:
            self.index.resume_at(_rows(start) + 1, int(start["bytes"]))

    def commit(self, end: dict) -> None:
        """Spark committed the rows up to ``end``: their lines are never asked for again."""
        self.index.read_past(_rows(end))

    def read(self, partition: InputPartition) -> Iterator[tuple]:
        assert isinstance(partition, CsvRowsPartition)
        # Line by line, none read past ROW_READ_FACTOR x max_record_bytes: a huge line (a
        # file whose lines end in \r alone is one) was read whole, then copied by the split,
        # before its length made it a dead letter: the worker's OOM on every retry.
        cap = ROW_READ_FACTOR * self.max_record_bytes
        with open(self.path, "rb") as handle:
            # A header that is not UTF-8 still names its columns (with replacement
            # characters): failing on it would fail every batch of the query.
            first = handle.readline(cap + 1)
            header_line = first.decode("utf-8-sig", errors="replace")
            unreadable: str | None = None
            if len(first) > cap and not first.endswith(b"\n"):
                header_line, unreadable = "", f"the header (line 1) is over {cap} bytes"
            handle.seek(partition.byte_begin)
            yield from self._rows_of(handle, partition, header_line, unreadable, cap)

    def _rows_of(
        self,
        handle: Any,
        partition: CsvRowsPartition,
        header_line: str,
        unreadable: str | None,
        cap: int,
    ) -> Iterator[tuple]:
        """The records of ``partition``'s rows, read from ``handle`` (at its first byte)."""
        try:
            header = next(csv.reader([header_line.rstrip("\r\n")], strict=True), [])
        except csv.Error as exc:  # (a lone \r, a field over csv.field_size_limit)
            header, unreadable = [], f"the header (line 1) cannot be read as CSV: {exc}"
        repeated = sorted({name for name in header if header.count(name) > 1})
        if repeated:
            # (An event is a mapping: each row silently lost the cell of the first of two
            # columns of one name. A review's finding.)
            unreadable = (
                f"the header (line 1) names {', '.join(map(repr, repeated))} more than once: "
                "a row's cells would not each have a field of their own"
            )
        now = time.time() * 1000.0
        at, k = partition.byte_begin, partition.start
        while at < partition.byte_end:
            line = handle.readline(min(cap + 1, partition.byte_end - at))
            at += len(line)
            raw = line.removesuffix(b"\n")
            total = len(raw)
            if line and raw is line and at < partition.byte_end:  # its first cap + 1 bytes
                skipped, ended = _skip_line(handle, partition.byte_end - at)
                at, total = at + skipped, total + skipped - ended
            k += 1
            if not line or k > partition.end:
                raise InvariantViolation(
                    f"source {self.pe!r}: bytes {partition.byte_begin}-{partition.byte_end} "
                    f"of {self.path} do not hold rows {partition.start + 1}-{partition.end} "
                    f"(line {k} ends at byte {at})",
                    hint="a csv-source reads a file that is only appended to",
                )
            if unreadable is not None:  # every row: none has columns to be named by
                text = raw.removesuffix(b"\r").decode("utf-8", errors="backslashreplace")
                yield self._dead(k, text, f"row {k} has no column names: {unreadable}", now)
                continue
            yield self._row(k, raw.removesuffix(b"\r"), header, now, total)
        if k != partition.end:
            raise InvariantViolation(
                f"source {self.pe!r}: bytes {partition.byte_begin}-{partition.byte_end} of "
                f"{self.path} hold {k - partition.start} lines, not rows "
                f"{partition.start + 1}-{partition.end}",
                hint="a csv-source reads a file that is only appended to",
            )

    def _row(
        self, k: int, raw: bytes, header: list[str], now: float, total: int | None = None
    ) -> tuple:
        """The record of data row ``k`` (``raw``: its bytes without the line end, or their
        first part if the row is ``total`` bytes long)."""
        total = len(raw) if total is None else total
        if total > ROW_READ_FACTOR * self.max_record_bytes:
            reason = (
                f"row {k} is {total} bytes, over {ROW_READ_FACTOR} times the record limit "
                f"of {self.max_record_bytes} bytes (max_record_bytes): not read as CSV"
            )
            kept = raw[: self.max_record_bytes].decode("utf-8", errors="backslashreplace")
            return self._dead(k, kept, reason, now, total=total)
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            reason = f"row {k} is not valid UTF-8 ({exc.reason} at byte {exc.start})"
            return self._dead(k, raw.decode("utf-8", errors="backslashreplace"), reason, now)
        try:
            # Strict: the lenient reader took `1,"unterminated` for the cell `unterminated`
            # and `3,"a" b` for `a b`, events no row holds, with no dead letter.
            cells = next(csv.reader([line], strict=True), [])
        except csv.Error as exc:  # a field over csv.field_size_limit, a lone \r, a NUL...
            why = f"row {k} cannot be read as CSV: {exc}"
            if "unexpected end of data" in str(exc):
                why += (
                    " (a quote not closed on its line: a csv-source reads one record per "
                    "line, no line break inside quotes)"
                )
            return self._dead(k, line, why, now)
        if len(cells) != len(header):
            reason = (
                f"row {k} has {len(cells)} columns, the header has {len(header)} "
                f"({', '.join(header)})"
            )
            return self._dead(k, line, reason, now)
        body = dump_body(
            {name: parse_value(cell) for name, cell in zip(header, cells, strict=True)}
        )
        size = oversize(k, now, self.pe, body, None, self.max_record_bytes)
        if size is not None:
            reason = (
                f"row {k} is {size} bytes as an event, over the limit of "
                f"{self.max_record_bytes} bytes (max_record_bytes)"
            )
            return self._dead(k, line, reason, now)
        return (k, 0, k, now, self.pe, body, None)

    def _dead(self, k: int, line: str, reason: str, now: float, total: int | None = None) -> tuple:
        """A dead letter of row ``k`` (``line``; ``total``: its whole length, if ``line`` is
        a part of it)."""
        # Cut first to what could fit (a character is a byte at least in the record): the
        # whole of a huge line escaped, measured and cut cost ~9x its size (a worker's OOM).
        kept = line[: self.max_record_bytes]
        body, reason = fit_dead_letter(
            k, now, self.pe, json.dumps({"line": kept}), reason, self.max_record_bytes,
            len(line) if total is None else total,
        )  # fmt: skip
        return (k, 0, k, now, self.pe, body, reason)


@dataclass
class SinkRows(WriterCommitMessage):
    """Rows of one write task, handed to the driver, which appends them."""

    rows: list[SinkRow]
    #: The origins of the rows that are no events (a message on the input's subject no PE
    #: wrote: :data:`~fogshift.events.NOT_AN_EVENT`), dead-lettered instead of written.
    not_events: list[int] = field(default_factory=list)


class CsvSinkDataSource(DataSource):
    """Options: ``path``, ``pipeline``, ``pe``, ``broker`` (for the sink's dead letters)."""

    @classmethod
    def name(cls) -> str:
        return "fogshift-csv-sink"

    def schema(self) -> str:
        return "origin long, seq long, timestamp double, creator string, body string"

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:  # noqa: N802
        return CsvSinkWriter(dict(self.options))


def marker_path(path: str | Path) -> Path:
    """Where the exactly-once marker of output file ``path`` lives."""
    target = Path(path)
    return target.with_name(f".{target.name}.fogshift.json")


def read_marker(path: str | Path) -> dict[str, Any]:
    """The marker of output file ``path`` (a fresh one if none was written yet)."""
    marker = marker_path(path)
    if marker.exists():
        return dict(json.loads(marker.read_text()))
    return _fresh_marker()


def _fresh_marker() -> dict[str, Any]:
    """The marker of a file nothing was written to."""
    return {"type": "csv-sink", "origin": 0, "bytes": 0, "lines": 0, "fields": None}


def _write_marker(path: str | Path, marker: dict[str, Any]) -> None:
    target = marker_path(path)
    # A file of its own, made new: the fixed name it had, opened to write, followed a link
    # put there (a folder others write to) over any file it named, or took a file someone
    # else made there, whose owner could then rewrite the marker before its rename.
    fd, name = tempfile.mkstemp(prefix=f"{target.name}.", suffix=".tmp", dir=target.parent)
    tmp = Path(name)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "w") as handle:
            json.dump(marker, handle)
            handle.flush()
            os.fsync(handle.fileno())
        tmp.replace(target)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    # The rename made durable too: after a power loss the marker could be back at its
    # previous version while Spark's commit (elsewhere) survived, and the next batch cut
    # the file to the old length — a committed batch's rows lost, never replayed.
    sync_folder(target.parent)


def reset_sink(path: str | Path, epoch: int = 0, owner: str = "") -> None:
    """Forget what a sink wrote (fresh deploys): empty the file and start its marker afresh
    under ``epoch``, the new deployment's, under the file's lock. So an instance of an
    earlier deployment that missed the stop (a frozen node) is fenced at its next append:
    with the marker deleted it read epoch 0, appended its rows, and the new sink's rows up
    to their origins were then skipped as written.

    A marker of a higher epoch is replaced too: a fresh deploy starts the file over, also
    one left by another cluster (whose epochs are not this one's). The marker names its
    ``owner`` (``pipeline/sink``), since epochs are counted per PE: an instance of another
    pipeline's sink, or of a sink renamed since, that missed its stop is fenced whatever
    its epoch (:func:`_append`).

    Raises:
        SinkBusy: Another writer held the file's lock for :data:`LOCK_WAIT_S`.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target, owner):
        target.write_bytes(b"")
        _write_marker(target, {**_fresh_marker(), "epoch": epoch, "owner": owner})


def _cell(value: Any) -> str:
    """A body's value as a CSV cell: a float as Python writes it back exactly, text as it
    is, anything else as its JSON (``true``, ``null``, ``[1, 2]``: written as Python's
    ``True``, ``None`` and ``{'a': 1}`` before 2026-12-07, which no other reader reads)."""
    if isinstance(value, float):
        return repr(value)
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def _csv_line(cells: list[Any]) -> bytes:
    """One CSV line ending in ``\n``, UTF-8 (strictly: text that cannot be raises).

    Written as if lines ended in ``\r\n``: the csv module quotes only cells holding a
    character of the line terminator, and a bare ``\r`` in a cell splits the row for
    every reader (Python's, pandas, a csv-source reading the file)."""
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\r\n").writerow(cells)
    return buffer.getvalue().removesuffix("\r\n").encode() + b"\n"


def append_exactly_once(
    path: str | Path,
    rows: list[SinkRow],
    on_refused: Callable[[list[tuple[SinkRow, str]]], None] | None = None,
    epoch: int = 0,
    owner: str = "",
    not_events: Collection[int] = (),
    fields: Sequence[str] | None = None,
) -> int:
    """Append under the file's lock; see :func:`_append`."""
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    with _locked(target, owner):
        return _append(target, rows, on_refused, epoch, owner, frozenset(not_events), fields)


@contextmanager
def _locked(target: Path, owner: str) -> Iterator[None]:
    """Hold the lock of output file ``target`` (every writer of it and its marker takes it).

    Raises:
        SinkBusy: Another writer held it for :data:`LOCK_WAIT_S`.
    """
    lock_path = marker_path(target).with_suffix(".lock")
    with open(lock_path, "a") as lock:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise SinkBusy(
                        f"sink {owner or target}: {lock_path} has been locked by another "
                        f"writer for {LOCK_WAIT_S:g} s",
                        hint="an earlier instance of this sink is stuck mid-append (a frozen "
                        "process or node on the storage both share): stop it; this batch is "
                        "tried again",
                    ) from None
                time.sleep(0.05)
        yield


def _append(
    target: Path,
    rows: list[SinkRow],
    on_refused: Callable[[list[tuple[SinkRow, str]]], None] | None,
    epoch: int,
    owner: str,
    not_events: frozenset[int] = frozenset(),
    declared: Sequence[str] | None = None,
) -> int:
    """Append rows ``(origin, seq, timestamp, body_json)`` not yet in the file.

    Args:
        path: The output file.
        rows: One batch's rows, in any order.
        on_refused: Called with the rows whose fields do not match the file's header (and the
            reason) before anything is appended, so they are dead-lettered before the marker
            moves past them.
        epoch: The writing instance's epoch; the marker keeps the highest seen.
        owner: The writer, ``pipeline/sink``: one the file was not reset for (the marker's
            ``owner``, if it names one) is fenced; named in a fencing error.
        not_events: The origins of rows that are no events (refused whatever their body:
            one that is a JSON object would have been written, and as the first row made
            the file's header).
        declared: The sink's ``fields`` option: the header of a file that has none yet
            (``None``: the first written row's fields; a file's header stays as written).

    Returns:
        The number of lines appended.

    Raises:
        Fenced: A newer epoch has written to this file, or it was reset for another sink:
            this instance must not.
    """
    marker = read_marker(target)
    claimed = str(marker.get("owner") or "")
    if owner and claimed and claimed != owner:
        # Epochs are counted per PE: another pipeline's sink (or one renamed since) that
        # missed its stop on a frozen node may hold as high a one as the sink the file was
        # reset for, and appended its rows there, or fenced that sink for good. (A
        # review's finding.)
        raise Fenced(
            f"{FENCED_TOKEN}: sink {owner} (epoch {epoch}) writes {target}, which was reset "
            f"for sink {claimed}: this instance must not write",
        )
    if int(marker.get("epoch", 0)) > epoch:
        raise Fenced(
            f"{FENCED_TOKEN}: sink {owner or target} runs under epoch {epoch}, but epoch "
            f"{marker['epoch']} has written {target}: this instance must not write",
        )
    if target.exists() and not target.is_file():
        # (Its size would be the directory's, "4096 bytes", and the append's open fail.)
        raise InvariantViolation(
            f"sink {owner or target}: its output {target} is no longer a file "
            f"({'a directory' if target.is_dir() else 'not a regular file'})",
            hint="something replaced the output file while the pipeline ran: put the file "
            "back at its path (the PE's query is restarted and tries the batch again)",
        )
    size = target.stat().st_size if target.exists() else 0
    if size and not marker_path(target).exists():
        # Every deploy writes the marker (reset_sink): none beside a file with rows is a
        # file this sink did not write, or whose marker was deleted. Taken as fresh, it
        # was cut to nothing at the next append, rows of batches committed long ago lost.
        raise InvariantViolation(
            f"sink {owner or target}: its output {target} holds {size} bytes but its "
            f"marker {marker_path(target).name} is gone: it cannot tell what of it was "
            "written, and writes nothing rather than cut the file",
            expected=f"the marker {marker_path(target)} beside the file",
            received="no marker",
            hint="put the marker back (the PE's query is restarted and tries the batch "
            "again), or move the file away and `fogshift deploy SPEC --fresh`",
        )
    if size < marker["bytes"]:
        raise InvariantViolation(
            f"sink file {target} is {size} bytes but {marker['bytes']} were committed to it",
            hint="the output file was truncated or replaced while the pipeline ran",
        )
    fresh = sorted((r for r in rows if r[0] > marker["origin"]), key=lambda r: r[0])
    if not fresh:
        if epoch > int(marker.get("epoch", 0)):
            # A restored instance replaying what was written: its epoch goes into the
            # marker now, so the instance it replaces (a zombie) is fenced from here on, not
            # only after the next new row.
            _write_marker(target, {**marker, "epoch": epoch})
        return 0
    fields: list[str] | None = marker["fields"]
    lines: list[bytes] = []
    refused: list[tuple[SinkRow, str]] = []
    written = 0
    for row in fresh:
        if row[0] in not_events:
            refused.append((row, f"not an event: {NOT_AN_EVENT_WHY}"))
            continue
        # Each line is made and encoded on its own: a body that cannot be written (nested
        # too deep to read, text that is no UTF-8, such as a lone surrogate a processor's
        # JSON escaped) is refused alone, not the batch again and again.
        try:
            body = load_body(row[3])
        except (ValueError, RecursionError) as exc:
            refused.append((row, f"not an event body: {type(exc).__name__}: {exc}"))
            continue
        if not body:  # (as the first row, it made a header of no field, refusing all else)
            refused.append((row, "an event with no fields has no CSV row to write"))
            continue
        names = (list(declared) if declared else list(body)) if fields is None else fields
        if len(body) != len(names) or set(body) != set(names):  # (in any order)
            refused.append((row, f"fields {list(body)} do not match the output header {names}"))
            continue
        try:
            header = _csv_line([seq_column(names), *names]) if fields is None else b""
            line = _csv_line([row[1], *(_cell(body[f]) for f in names)])
        except Exception as exc:
            refused.append((row, f"cannot be written as CSV: {type(exc).__name__}: {exc}"))
            continue
        if fields is None:
            fields = names
            lines.append(header)
        lines.append(line)
        written += 1
    if refused and on_refused is not None:
        on_refused(refused)
    data = b"".join(lines)
    with open(target, "r+b" if target.exists() else "w+b") as handle:
        handle.truncate(marker["bytes"])  # cut a torn tail left by a crash mid-append
        handle.seek(marker["bytes"])
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    _write_marker(
        target,
        {
            "type": "csv-sink",
            "origin": fresh[-1][0],
            "bytes": marker["bytes"] + len(data),
            "lines": marker["lines"] + written,
            "fields": fields,
            "epoch": max(epoch, int(marker.get("epoch", 0))),
            "owner": claimed or owner,
        },
    )
    return written


def seq_column(fields: list[str]) -> str:
    """The name of a sink file's first column (the input's sequence) beside the events'
    ``fields``: ``seq``, unless an event field has that name (a source file's own ``seq``
    column, say), then ``_seq`` (``__seq``, ...): the header wrote ``seq,seq,...``, read
    back as two columns of one name, and the events' own field keeps its name."""
    name = "seq"
    while name in fields:
        name = "_" + name
    return name


class CsvSinkWriter(DataSourceStreamWriter):
    """Collects rows on the executors; the driver appends them in ``commit``."""

    def __init__(self, options: dict[str, str]) -> None:
        self.path = options["path"]
        self.pipeline = options["pipeline"]
        self.pe = options["pe"]
        self.broker = options["broker"]
        self.epoch = int(options.get("epoch", "0"))
        self.max_record_bytes = int(options.get("max_record_bytes", DEFAULT_MAX_RECORD_BYTES))
        self.fields: list[str] | None = (
            json.loads(options["fields"]) if "fields" in options else None
        )

    def write(self, iterator: Iterator[Any]) -> WriterCommitMessage:
        rows: list[SinkRow] = []
        not_events: list[int] = []
        for r in iterator:
            rows.append((int(r.origin), int(r.seq), float(r.timestamp), str(r.body)))
            if r.creator == NOT_AN_EVENT:
                not_events.append(int(r.origin))
        return SinkRows(rows, not_events)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        sent = [m for m in messages if isinstance(m, SinkRows)]
        append_exactly_once(
            self.path,
            [row for m in sent for row in m.rows],
            self._dead_letter,
            self.epoch,
            f"{self.pipeline}/{self.pe}",
            {origin for m in sent for origin in m.not_events},
            self.fields,
        )

    def _dead_letter(self, refused: list[tuple[SinkRow, str]]) -> None:
        records = [
            Record(row[0], 0, row[1], row[2], self.pe, *self._fit(row, reason))
            for row, reason in refused
        ]
        client = shared_client(BrokerAddress.load(self.broker))
        client.run(lambda js: publish_records(js, self.pipeline, self.pe, records, self.epoch))

    def _fit(self, row: SinkRow, reason: str) -> tuple[str, str]:
        """Body and reason of a dead letter for ``row``, cut to fit the record size limit."""
        return fit_dead_letter(row[1], row[2], self.pe, row[3], reason, self.max_record_bytes)

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:  # noqa: N803
        """Nothing was appended before ``commit``."""
