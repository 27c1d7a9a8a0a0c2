"""Reading ledgers: a streaming JSONL reader that warns (file and line) and goes on.

A ledger is a directory of ``*.jsonl`` files (one per node) or a list of files. Lines are
validated against the schema; a malformed line, an unknown event type, a newer schema version
or a truncated last line gives one warning naming the file and line, and the line is skipped.
Events of every file are merged by wall time. Google Cloud Resiliency logs (lines with
``event_type``) are recognised per file, read (`resiliency.goodput._google`) and converted once
every file is read (`resiliency.goodput._google_cycles`): their per-node starts and ends make
cycles only together.
"""

from __future__ import annotations

import gc
import itertools
import json
import operator
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import timezone, tzinfo
from pathlib import Path
from typing import Any

from resiliency.goodput._google import GoogleLog
from resiliency.goodput._google_cycles import convert
from resiliency.goodput._step_scan import looks_like_steps, parallel_workers, scan, scan_all
from resiliency.goodput._time import _minute_cache, parse_time
from resiliency.goodput.errors import GoodputError
from resiliency.goodput.schema import EVENT_TYPES, SCHEMA_VERSION, validate_event

BLOCK_BYTES = 1 << 20
_MINUTE = operator.itemgetter(slice(0, 16))
_SECONDS = operator.itemgetter(slice(17, 26))
_ZONE = operator.itemgetter(slice(26, None))
_UNSCANNED = object()
CLOCK_TOLERANCE_S = 1.0
MAX_WARNINGS_PER_FILE = 20


@dataclass
class Event:
    """One ledger event (all but ``step``): wall time (epoch seconds), type, line and origin."""

    time: float
    event: str
    data: dict[str, Any]
    source: str
    line: int

    @property
    def node(self) -> str:
        return str(self.data.get("node", ""))

    @property
    def attempt(self) -> int:
        return int(self.data.get("attempt") or 0)


@dataclass
class Ledger:
    """The merged content of a ledger.

    ``events`` holds every event but steps, sorted by time; ``steps`` holds
    ``(time, step, attempt)`` of the step events, sorted by time (there can be a million).
    ``notes`` say how something was read (not a problem: e.g. the zone of naive times).
    """

    events: list[Event] = field(default_factory=list)
    steps: list[tuple[float, int, int]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    jobs: set[str] = field(default_factory=set)
    files: list[str] = field(default_factory=list)
    google: GoogleLog | None = None
    lines: int = 0
    notes: list[str] = field(default_factory=list)


def ledger_files(paths: Iterable[str | os.PathLike[str]]) -> list[Path]:
    """The ``*.jsonl`` files of every directory in ``paths``, and every file named."""
    files: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            files.extend(sorted(p for p in path.glob("*.jsonl") if p.is_file()))
        elif path.is_file():
            files.append(path)
        else:
            raise GoodputError(f"no such ledger file or directory: {path}")
    return files


def _positions_of_others(events: list[Any]) -> list[int]:
    """Indices of the events that are not steps (few), found at C speed."""
    try:
        kinds = set(events) - {"step"}
    except TypeError:  # an unhashable "event" value: look at each
        return [i for i, e in enumerate(events) if e != "step"]
    positions: list[int] = []
    for kind in kinds:
        index = events.index(kind)
        while True:
            positions.append(index)
            try:
                index = events.index(kind, index + 1)
            except ValueError:
                break
    return sorted(positions)


def _problem(obj: Any) -> str | None:
    """Why a line is skipped, or None for a valid event of a version this reader knows."""
    if not isinstance(obj, dict):
        return "not a JSON object; skipped"
    schema = obj.get("schema")
    if isinstance(schema, int) and schema > SCHEMA_VERSION:
        return (
            f"schema version {schema} is newer than this reader's ({SCHEMA_VERSION}); "
            "line skipped (upgrade resiliency-goodput)"
        )
    if obj.get("event") not in EVENT_TYPES and isinstance(obj.get("event"), str):
        return f"unknown event type {obj['event']!r} skipped"
    problem = validate_event(obj)
    return None if problem is None else f"invalid event skipped: {problem}"


class _FileReader:
    """Reads one file into a `Ledger`, warning with file and line number."""

    def __init__(self, path: Path, ledger: Ledger, zone: tzinfo) -> None:
        self.path = path
        self.zone = zone
        self.name = str(path)
        self.ledger = ledger
        self.warned = 0
        self.warnings: list[str] = []
        self.google: bool | None = None
        self.offset = 0  # bytes of whole lines read so far
        self.lines = 0  # lines read so far

    def warn(self, line: int, message: str) -> None:
        self.warned += 1
        if self.warned <= MAX_WARNINGS_PER_FILE:
            self.warnings.append(f"{self.name}:{line}: {message}")
        elif self.warned == MAX_WARNINGS_PER_FILE + 1:
            self.warnings.append(f"{self.name}: more problems; not shown")

    def read(self, progress: Callable[[int], None] | None, final: bool = True) -> None:
        """Read what was appended since the last call.

        Args:
            progress: called with the bytes read.
            final: also take a last line without its newline (and warn if it is cut); False
                leaves it for the next call (a writer may be writing it).
        """
        workers = parallel_workers(max(self.path.stat().st_size - self.offset, 0))
        if workers > 1:  # every block read first, scanned by the workers
            blocks = list(self._blocks(final))
            scanned = scan_all([b for b, _ in blocks], workers)
            pairs: Iterable[tuple[tuple[bytes, bool], Any]] = zip(blocks, scanned, strict=True)
        else:  # one block in memory at a time
            pairs = zip(self._blocks(final), itertools.repeat(_UNSCANNED))
        for (block, truncated), result in pairs:
            self.lines += self._block(block, self.lines, truncated, result)
            if progress is not None:
                progress(len(block))

    def _blocks(self, final: bool) -> Iterator[tuple[bytes, bool]]:
        """``(block, last line cut)`` of whole lines appended since the last call (and of a
        last line without its newline if ``final``)."""
        with self.path.open("rb") as stream:
            stream.seek(self.offset)
            rest = b""
            while True:
                data = stream.read(BLOCK_BYTES)
                block = rest + data
                if not data:
                    if block and final:
                        yield block, not block.endswith(b"\n")
                        self.offset += len(block)
                    return
                end = block.rfind(b"\n") + 1
                block, rest = block[:end], block[end:]
                if block:
                    yield block, False
                    self.offset += len(block)

    def _block(self, block: bytes, before: int, truncated: bool, scanned: Any) -> int:
        """Parse a block of whole lines (the last one maybe without its newline); return its
        number of lines (the scan counts them, so most blocks need no count of their own).

        ``scanned``: the block's `scan` done elsewhere, None if it found no step lines to read
        without JSON, or ``_UNSCANNED``.
        """
        if scanned is _UNSCANNED and looks_like_steps(block):
            try:  # mostly the recorder's step lines: read them without JSON
                scanned = scan(block)
            except ValueError:  # e.g. an impossible date: the JSON reader says where
                scanned = None
        if scanned is not None and scanned is not _UNSCANNED:
            steps, others = scanned
            self.ledger.steps.extend(steps)
            for index, raw in others:
                self._line(before + 1 + index, raw, cut=False)
            return len(steps) + len(others)  # the scan sorts every line into one of the two
        body = block[:-1] if block.endswith(b"\n") else block
        try:  # one parse for the whole block: much faster than a parse per line
            objs = json.loads(b"[" + body.replace(b"\n", b",") + b"]")
        except ValueError:
            self._lines(body.split(b"\n"), before, truncated)
        else:
            self._objects(objs, before + 1)
        return block.count(b"\n") + truncated

    def _lines(self, lines: list[bytes], before: int, truncated: bool) -> None:
        """The slow way, line by line, for a block with a bad line."""
        for n, raw in enumerate(lines, before + 1):
            self._line(n, raw, cut=truncated and n == before + len(lines))

    def _line(self, n: int, raw: bytes, cut: bool) -> None:
        """Parse line ``n``; ``cut``: it is the last line and has no newline."""
        text = raw.strip()
        if not text:
            return
        try:
            obj = json.loads(text)
        except ValueError as exc:
            if cut:
                self.warn(n, f"truncated last line (no newline; {len(raw)} bytes) skipped")
            else:
                reason = getattr(exc, "msg", str(exc))
                shown = text[:80].decode("utf-8", "replace")
                self.warn(n, f"malformed line skipped ({reason}): {shown!r}")
            return
        self._add(n, obj)

    def _objects(self, objs: list[Any], first: int) -> None:
        """Add parsed lines; well-formed step lines in bulk (there can be millions)."""
        try:
            events = list(map(dict.get, objs, itertools.repeat("event")))
        except TypeError:  # a line that is no object: one by one
            events = []
        if events.count("step") < 64 or not self._bulk_steps(objs, events):
            for n, obj in enumerate(objs, first):
                self._add(n, obj)
            return
        for i in _positions_of_others(events):
            self._add(first + i, objs[i])

    def _bulk_steps(self, objs: list[Any], events: list[Any]) -> bool:
        """Add every step line of a block at C speed; False (nothing added) if one is unusual."""
        if events.count("step") == len(events):
            steps = objs
        else:
            is_step = map(operator.eq, events, itertools.repeat("step"))
            steps = list(itertools.compress(objs, is_step))
        get, every = dict.get, itertools.repeat
        numbers: list[Any] = list(map(get, steps, every("step")))
        attempts: list[Any] = list(map(get, steps, every("attempt")))
        times: list[Any] = list(map(get, steps, every("time")))
        if (
            set(map(get, steps, every("schema"))) != {SCHEMA_VERSION}
            or set(map(type, numbers)) != {int}
            or set(map(type, attempts)) != {int}
            or set(map(type, times)) != {str}
            or set(map(len, times)) != {32}
            or set(map(_ZONE, times)) != {"+00:00"}
        ):
            return False
        minutes = list(map(_MINUTE, times))
        try:
            for minute in set(minutes) - _minute_cache.keys():
                parse_time(minute + ":00.000000+00:00")
            seconds = list(map(float, map(_SECONDS, times)))
        except ValueError:
            return False
        when = map(operator.add, map(_minute_cache.__getitem__, minutes), seconds)
        self.ledger.steps.extend(zip(when, numbers, attempts, strict=True))
        return True

    def _add(self, n: int, obj: Any) -> None:
        ledger = self.ledger
        if self.google is None and isinstance(obj, dict):
            self.google = "event_type" in obj and "event" not in obj
        if self.google:
            self._add_google(n, obj)
            return
        problem = _problem(obj)
        if problem is None:
            try:
                when = parse_time(obj["time"])
            except ValueError as exc:
                problem = f"bad time skipped: {exc}"
        if problem is not None:
            self.warn(n, problem)
            return
        ledger.jobs.add(obj["job"])
        if obj["event"] == "step":
            ledger.steps.append((when, obj["step"], obj["attempt"]))
        else:
            ledger.events.append(Event(when, obj["event"], obj, self.name, n))

    def _add_google(self, n: int, obj: Any) -> None:
        """Keep a Google line for the conversion that follows the reading of every file."""
        if self.ledger.google is None:
            self.ledger.google = GoogleLog(self.zone)
        try:
            record = self.ledger.google.add(obj, self.name, n)
        except ValueError as exc:
            self.warn(n, f"Google log line skipped: {exc}")
            return
        self.ledger.jobs.add(record.job)


def _check_clocks(ledger: Ledger) -> None:
    """Warn about events dated before the start of their own cycle (a node's clock is off)."""
    starts: dict[int, Event] = {}
    for ev in ledger.events:
        if ev.event == "cycle_started":
            cycle = int(ev.data.get("cycle", ev.attempt))
            if cycle not in starts or ev.time < starts[cycle].time:
                starts[cycle] = ev
    for ev in ledger.events:
        start = starts.get(ev.attempt)
        if start is None or ev.event in ("cycle_started", "job_started", "job_scheduled"):
            continue
        if ev.source != start.source and ev.time < start.time - CLOCK_TOLERANCE_S:
            ledger.warnings.append(
                f"{ev.source}:{ev.line}: clocks out of order across nodes: {ev.event} of "
                f"attempt {ev.attempt} is dated {start.time - ev.time:.1f} s before that "
                f"attempt's cycle_started ({start.source}:{start.line}); events are merged by "
                "wall time, check the nodes' clock synchronisation"
            )


def _finish_google(
    ledger: Ledger, google: GoogleLog, previous: set[tuple[float, int, int]]
) -> set[tuple[float, int, int]]:
    """Replace the events converted from Google records by a conversion of all of them.

    Args:
        ledger: the ledger read so far.
        google: its Google records.
        previous: the progress marks the last conversion added (taken out first).

    Returns:
        The progress marks added now.
    """
    ledger.events = [ev for ev in ledger.events if not ev.data.get("google")]
    if previous:
        ledger.steps = [s for s in ledger.steps if s not in previous]
    converted, steps = convert(google.records)
    ledger.events += [Event(*c) for c in converted]
    ledger.events.sort(key=lambda e: e.time)
    ledger.steps += steps
    if google.naive:
        ledger.notes.append(
            f"{google.naive:,} Google log time(s) carry no time zone (its tracker writes "
            f"local wall time): read as {google.zone} (--timezone)"
        )
    return set(steps)


class LedgerReader:
    """Reads ledger files incrementally: each `update` parses only what was appended.

    Args:
        paths: files or directories (their ``*.jsonl`` files, found again at every update).
        zone: the zone of times without one (Google's tracker writes local wall time).
    """

    def __init__(
        self, paths: Iterable[str | os.PathLike[str]], zone: tzinfo = timezone.utc
    ) -> None:
        self.paths = list(paths)
        self.zone = zone
        self.ledger = Ledger()
        self._readers: dict[Path, _FileReader] = {}
        self._google_steps: set[tuple[float, int, int]] = set()

    def update(
        self, progress: Callable[[int, int], None] | None = None, final: bool = False
    ) -> Ledger:
        """Read what the files gained since the last update; return the merged ledger.

        Args:
            progress: called with ``(bytes read, bytes to read)``.
            final: also take (or warn about) a last line without its newline.
        """
        ledger = self.ledger
        files = ledger_files(self.paths)
        ledger.files = [str(f) for f in files]
        for path in files:
            if path not in self._readers:
                self._readers[path] = _FileReader(path, ledger, self.zone)
        total = sum(max(f.stat().st_size - self._readers[f].offset, 0) for f in files)
        done = 0

        def advance(nbytes: int) -> None:
            nonlocal done
            done += nbytes
            if progress is not None:
                progress(done, total)

        for path in files:
            self._readers[path].read(advance if progress is not None else None, final)
        ledger.lines = sum(r.lines for r in self._readers.values())
        ledger.events.sort(key=lambda e: e.time)
        ledger.notes = []
        if ledger.google is not None:
            self._google_steps = _finish_google(ledger, ledger.google, self._google_steps)
        ledger.steps.sort()
        ledger.warnings = [w for r in self._readers.values() for w in r.warnings]
        _check_clocks(ledger)
        if len(ledger.jobs) > 1:
            ledger.warnings.append(
                f"the ledger holds several jobs ({', '.join(sorted(ledger.jobs))}); "
                "they are computed as one timeline"
            )
        return ledger


def read_ledger(
    paths: Iterable[str | os.PathLike[str]],
    progress: Callable[[int, int], None] | None = None,
    zone: tzinfo = timezone.utc,
) -> Ledger:
    """Read and merge the ledger files (or directories of them) in ``paths``.

    Args:
        paths: files or directories.
        progress: called with ``(bytes read, total bytes)`` as reading goes on.
        zone: the zone of times without one (Google's tracker writes local wall time).
    """
    collecting = gc.isenabled()
    # A ledger is millions of small tuples and dicts without reference cycles: the cycle
    # collector's passes over them would cost a fifth of the read and free nothing.
    gc.disable()
    try:
        return LedgerReader(paths, zone).update(progress, final=True)
    finally:
        if collecting:
            gc.enable()
