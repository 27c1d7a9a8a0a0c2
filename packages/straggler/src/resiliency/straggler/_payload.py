"""The per-rank summary exchanged between ranks: a small packed frame, validated on receipt.

Nothing received from another process is unpickled. A frame is a fixed header (``struct``), the
node name, the names of sections and kernels as JSON, then the numbers as packed little-endian
float64 and int64 arrays. Numbers are packed rather than written as JSON text because rank 0
decodes thousands of frames per report and parsing float text dominated that cost; the name lists
are usually identical on every rank, so rank 0 parses each distinct list once.

A frame that fails validation raises :class:`~resiliency.straggler.errors.ExchangeError` naming
what is wrong; the caller logs it and leaves that rank out of the report rather than failing.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field

from resiliency.straggler.errors import ExchangeError

__all__ = [
    "PAYLOAD_VERSION",
    "Columns",
    "GatheredSummaries",
    "RankSummary",
    "decode_summary",
    "encode_summary",
]

PAYLOAD_VERSION = 1
MAX_PAYLOAD_BYTES = 64 * 1024 * 1024
"""A larger payload is refused (one rank's summary is normally a few kilobytes)."""


@dataclass
class RankSummary:
    """One rank's contribution to a report window.

    Attributes:
        rank: Global rank.
        node: Node name.
        section_medians: Section -> median CPU duration (us) in this window.
        kernel_medians: Kernel -> (median duration in us, launch count) in this window.
        section_individual: Section -> individual score, computed on the rank itself.
        gpu_individual: GPU individual score, or ``None`` without kernel samples.
    """

    rank: int
    node: str
    section_medians: dict[str, float] = field(default_factory=dict)
    kernel_medians: dict[str, tuple[float, int]] = field(default_factory=dict)
    section_individual: dict[str, float] = field(default_factory=dict)
    gpu_individual: float | None = None


_MAGIC = b"RSTS"
# magic, payload version, rank, has GPU individual score, node length, names length
_HEADER = struct.Struct("<4sHIBHI")
_NAME_CACHE_LIMIT = 4096


def encode_summary(summary: RankSummary) -> bytes:
    """Serialize a summary into one frame (see the module docstring for the layout)."""
    kernels = summary.kernel_medians
    node = summary.node.encode()
    names = json.dumps(
        [list(summary.section_medians), list(kernels), list(summary.section_individual)],
        separators=(",", ":"),
    ).encode()
    floats = [
        *summary.section_medians.values(),
        *(median for median, _ in kernels.values()),
        *summary.section_individual.values(),
    ]
    has_gpu = summary.gpu_individual is not None
    if summary.gpu_individual is not None:
        floats.append(summary.gpu_individual)
    counts = [count for _, count in kernels.values()]
    return b"".join(
        (
            _HEADER.pack(_MAGIC, PAYLOAD_VERSION, summary.rank, has_gpu, len(node), len(names)),
            node,
            names,
            struct.pack(f"<{len(floats)}d", *floats),
            struct.pack(f"<{len(counts)}q", *counts),
        )
    )


def _parse_names(raw: bytes) -> tuple[list[str], list[str], list[str]]:
    try:
        doc = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ExchangeError(f"summary names are not valid JSON: {exc}") from exc
    if not (isinstance(doc, list) and len(doc) == 3):
        raise ExchangeError("summary names are not three lists")
    for what, names in zip(("section", "kernel", "individual-score section"), doc, strict=True):
        if not isinstance(names, list) or not set(map(type, names)) <= {str}:
            raise ExchangeError(f"summary {what} names are not a list of strings")
        if len(set(names)) != len(names):
            raise ExchangeError(f"summary {what} names repeat a name")
    return doc[0], doc[1], doc[2]


_Names = tuple[list[str], list[str], list[str]]


@dataclass
class _Frame:
    rank: int
    node: str
    names: _Names
    names_key: bytes
    has_gpu: int
    floats: tuple[float, ...]
    counts: tuple[int, ...]


def _parse_frame(data: bytes, cache: dict[bytes, _Names]) -> _Frame:
    if len(data) > MAX_PAYLOAD_BYTES:
        raise ExchangeError(f"summary of {len(data)} bytes exceeds {MAX_PAYLOAD_BYTES}")
    if len(data) < _HEADER.size:
        raise ExchangeError(f"summary of {len(data)} bytes is shorter than its header")
    magic, version, rank, has_gpu, node_len, names_len = _HEADER.unpack_from(data)
    if magic != _MAGIC:
        raise ExchangeError("summary does not start with the straggler frame marker")
    if version != PAYLOAD_VERSION:
        raise ExchangeError(
            f"summary has payload version {version}, this resiliency-straggler reads "
            f"{PAYLOAD_VERSION}; install the same resiliency-straggler version on every node"
        )
    if has_gpu > 1:
        raise ExchangeError(f"summary GPU flag is {has_gpu}, not 0 or 1")
    offset = _HEADER.size
    try:
        node = data[offset : offset + node_len].decode()
    except UnicodeDecodeError as exc:
        raise ExchangeError(f"summary node name is not UTF-8: {exc}") from exc
    offset += node_len
    raw_names = data[offset : offset + names_len]
    offset += names_len
    names = cache.get(raw_names)
    if names is None:
        names = _parse_names(raw_names)
        if len(cache) < _NAME_CACHE_LIMIT:
            cache[raw_names] = names
    n_ker = len(names[1])
    n_floats = len(names[0]) + n_ker + len(names[2]) + has_gpu
    expected = offset + 8 * n_floats + 8 * n_ker
    if len(data) != expected:
        raise ExchangeError(f"summary is {len(data)} bytes, its header implies {expected}")
    floats = struct.unpack_from(f"<{n_floats}d", data, offset)
    counts = struct.unpack_from(f"<{n_ker}q", data, offset + 8 * n_floats)
    # One sum detects any NaN or infinity (and absurd magnitudes) among all the numbers.
    if not math.isfinite(sum(floats)):
        raise ExchangeError("summary holds a number that is not finite")
    if counts and min(counts) < 0:
        raise ExchangeError("summary holds a negative kernel launch count")
    return _Frame(rank, node, names, raw_names, has_gpu, floats, counts)


def decode_summary(data: bytes) -> RankSummary:
    """Parse and validate one frame produced by :func:`encode_summary`.

    Args:
        data: The bytes received from a peer.

    Returns:
        The validated summary.

    Raises:
        ExchangeError: The frame is oversized, truncated, of another payload version, or holds
            values outside the schema (non-finite numbers, negative counts, ...).
    """
    frame = _parse_frame(data, {})
    sections, kernels, individual = frame.names
    n_sec, n_ker = len(sections), len(kernels)
    floats = frame.floats
    return RankSummary(
        rank=frame.rank,
        node=frame.node,
        section_medians=dict(zip(sections, floats[:n_sec], strict=False)),
        kernel_medians=dict(
            zip(kernels, zip(floats[n_sec:], frame.counts, strict=False), strict=False)
        ),
        section_individual=dict(zip(individual, floats[n_sec + n_ker :], strict=False)),
        gpu_individual=floats[-1] if frame.has_gpu else None,
    )


Columns = dict[str, tuple[list[int], list[float]]]
"""Name -> (ranks, values): one column of numbers per section, across ranks."""


@dataclass
class _Group:
    names: _Names
    has_gpu: int
    ranks: list[int] = field(default_factory=list)
    rows: list[tuple[float, ...]] = field(default_factory=list)
    counts: list[tuple[int, ...]] = field(default_factory=list)


class GatheredSummaries:
    """Every rank's frame of one report window, kept in columns for fast scoring.

    Ranks that send the same name lists (the usual case) form one group; their numbers are
    transposed into per-section columns with one C-level ``zip`` instead of per-rank dicts.
    """

    def __init__(self) -> None:
        self._cache: dict[bytes, _Names] = {}
        self._groups: dict[tuple[bytes, int], _Group] = {}
        self.rank_to_node: dict[int, str] = {}

    def add(self, data: bytes) -> None:
        """Validate one frame and add it.

        Raises:
            ExchangeError: The frame does not follow the schema (nothing is added).
        """
        frame = _parse_frame(data, self._cache)
        key = (frame.names_key, frame.has_gpu)
        group = self._groups.get(key)
        if group is None:
            group = self._groups[key] = _Group(frame.names, frame.has_gpu)
        group.ranks.append(frame.rank)
        group.rows.append(frame.floats)
        group.counts.append(frame.counts)
        self.rank_to_node[frame.rank] = frame.node

    def _columns(self, which: int) -> Columns:
        out: Columns = {}
        for group in self._groups.values():
            sections, kernels, _ = group.names
            names = group.names[which]
            if not names:
                continue
            start = (0, len(sections), len(sections) + len(kernels))[which]
            columns = list(zip(*group.rows, strict=True))[start : start + len(names)]
            for name, column in zip(names, columns, strict=True):
                known = out.get(name)
                if known is None:
                    out[name] = (list(group.ranks), list(column))
                else:
                    known[0].extend(group.ranks)
                    known[1].extend(column)
        return out

    def section_medians(self) -> Columns:
        """Section -> (ranks, median durations in us)."""
        return self._columns(0)

    def section_individual(self) -> Columns:
        """Section -> (ranks, individual scores)."""
        return self._columns(2)

    def kernel_medians(self) -> list[tuple[int, dict[str, tuple[float, int]]]]:
        """``(rank, {kernel: (median_us, count)})`` for every rank with kernel samples."""
        out = []
        for group in self._groups.values():
            n_sec, kernels = len(group.names[0]), group.names[1]
            if not kernels:
                continue
            for rank, row, counts in zip(group.ranks, group.rows, group.counts, strict=True):
                medians = row[n_sec : n_sec + len(kernels)]
                out.append(
                    (rank, dict(zip(kernels, zip(medians, counts, strict=True), strict=True)))
                )
        return out

    def gpu_individual(self) -> dict[int, float]:
        """Rank -> GPU individual score, for ranks that sent one."""
        return {
            rank: row[-1]
            for group in self._groups.values()
            if group.has_gpu
            for rank, row in zip(group.ranks, group.rows, strict=True)
        }
