"""Step lines as the recorder writes them, read with one regular expression instead of JSON.

A long job's ledger is almost all ``step`` lines, every one in the recorder's own fixed shape
(key order, UTC time with microseconds). One pass of a compiled pattern over a block splits it
into those lines, read field by field, and every other line, left for the JSON reader with its
line number. A step line in any other shape (hand-written, another writer) is simply one of the
other lines; a block with many of them is better parsed as a whole by the JSON reader.
"""

from __future__ import annotations

import itertools
import multiprocessing
import operator
import os
import re
import threading
from array import array

from resiliency.goodput._time import parse_time
from resiliency.goodput.schema import SCHEMA_VERSION

_STEP = (
    rb'\{"schema":' + str(SCHEMA_VERSION).encode() + rb',"job":"[^"\\\n]*","event":"step",'
    rb'"time":"(\d{4}-\d\d-\d\dT\d\d:\d\d):(\d\d\.\d{6})\+00:00",'
    rb'"mono":-?[0-9.eE+-]+,"node":"[^"\\\n]*","rank":(?:0|null),'
    rb'"attempt":(\d{1,9}),"step":(\d{1,18})\}\n'
)
# Either a step line (groups 1-4) or any other line (group 5), in file order.
_LINE = re.compile(_STEP + rb"|([^\n]*\n)")
_OTHER = operator.itemgetter(4)
_GROUPS = [operator.itemgetter(i) for i in range(4)]
_minutes: dict[bytes, float] = {}


Columns = tuple[list[float], list[int], list[int]]
Scanned = tuple[list[tuple[float, int, int]], list[tuple[int, bytes]]]
# A scanned block as a worker process sends it back: arrays pickle as plain bytes.
_Packed = tuple[array, array, array, list[tuple[int, bytes]]]
PARALLEL_MIN_BYTES = 16 << 20
PARALLEL_MIN_CORES = 4


def looks_like_steps(block: bytes) -> bool:
    """Whether a block of whole lines seems to be mostly the recorder's step lines."""
    return block.endswith(b"\n") and b'"event":"step","time":' in block[:512]


def _columns(block: bytes, most_others: float) -> tuple[Columns, list[tuple[int, bytes]]] | None:
    found = _LINE.findall(block)
    others_text = list(map(_OTHER, found))
    positions = list(itertools.compress(range(len(found)), others_text))
    if len(positions) > most_others * len(found):
        return None
    others = [(i, others_text[i]) for i in positions]
    rows = list(itertools.filterfalse(_OTHER, found)) if positions else found
    minute, seconds, attempt, step = (list(map(g, rows)) for g in _GROUPS)
    try:  # a block spans a few minutes, all known but the first time: no set of a million
        bases = list(map(_minutes.__getitem__, minute))
    except KeyError:
        for text in set(minute) - _minutes.keys():
            _minutes[text] = parse_time(text.decode() + ":00.000000+00:00")
        bases = list(map(_minutes.__getitem__, minute))
    when = list(map(operator.add, bases, map(float, seconds)))
    return (when, list(map(int, step)), list(map(int, attempt))), others


def scan(block: bytes, most_others: float = 0.25) -> Scanned | None:
    """Split a block of whole lines (ending with a newline) into steps and other lines.

    Returns:
        ``(steps, others)``: ``(time, step, attempt)`` of every step line in the recorder's
        shape, and ``(index in the block, line)`` of every other line; None when more than
        ``most_others`` of the lines are other lines (the JSON reader is faster then).

    Raises:
        ValueError: a step line's time is no date (the JSON reader tells where).
    """
    result = _columns(block, most_others)
    if result is None:
        return None
    (when, step, attempt), others = result
    return list(zip(when, step, attempt, strict=True)), others


def _scan_packed(block: bytes) -> _Packed | None:
    if not looks_like_steps(block):
        return None
    try:
        result = _columns(block, 0.25)
    except ValueError:
        return None
    if result is None:
        return None
    (when, step, attempt), others = result
    return array("d", when), array("q", step), array("q", attempt), others


def scan_all(blocks: list[bytes], workers: int) -> list[Scanned | None]:
    """`scan` of every block that `looks_like_steps` (None for the others), in ``workers``
    forked processes. The caller makes sure that forking is safe (no other thread)."""
    context = multiprocessing.get_context("fork")
    with context.Pool(workers) as pool:
        packed = pool.map(_scan_packed, blocks, chunksize=1)
    return [None if p is None else (list(zip(p[0], p[1], p[2], strict=True)), p[3]) for p in packed]


def parallel_workers(nbytes: int) -> int:
    """How many processes should scan ``nbytes`` of ledger: 1 (this one) unless the ledger
    is large, the machine has several cores and this process has no other thread (a fork
    would copy another thread's locks in whatever state they are)."""
    cores = len(os.sched_getaffinity(0))
    # Workers cost CPU (a fork, the columns sent back and rebuilt): about 0.7 s more for a
    # million lines. On a machine of 2 or 3 cores, often shared, one process is cheaper.
    if nbytes < PARALLEL_MIN_BYTES or threading.active_count() > 1 or cores < PARALLEL_MIN_CORES:
        return 1
    return min(cores, 4)
