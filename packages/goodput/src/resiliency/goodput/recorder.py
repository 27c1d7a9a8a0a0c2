"""The ledger writer: `Recorder` and the process-wide `get_recorder()`.

Events are queued on the calling thread and written by a background thread (or at exit): one
``os.write`` of complete lines per batch on a file opened with ``O_APPEND``, so the launcher and
the ranks of a node can share one file. ``step()`` is sampled (at most one event per
``step_interval_s``, plus the last step before every flush), rank 0 only, and costs a clock read
and an attribute store on the training thread. Nothing here raises into training: a problem is
logged (at most once a minute per kind) and the event is dropped.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import re
import socket
import threading
import time
import weakref
from collections import deque
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from resiliency.goodput.schema import SCHEMA_VERSION, validate_fields

logger = logging.getLogger(__name__)

#: The ledger directory; every process of a job that records writes its node's file there.
DIR_ENV = "RESILIENCY_GOODPUT_DIR"
#: The job id the ledger files are named by (else torchrun's run id, else "default").
JOB_ID_ENV = "RESILIENCY_JOB_ID"
JOB_ENVS = (JOB_ID_ENV, "TORCHELASTIC_RUN_ID")
MAX_BATCH_BYTES = 1 << 20
_WARN_EVERY_S = 60.0
_last_warned: dict[str, float] = {}
_live: weakref.WeakSet[Recorder] = weakref.WeakSet()


def _warn(kind: str, message: str) -> None:
    """Log ``message`` at most once a minute per ``kind``."""
    now = time.monotonic()
    if now - _last_warned.get(kind, -_WARN_EVERY_S) >= _WARN_EVERY_S:
        _last_warned[kind] = now
        logger.warning("goodput recorder: %s", message)


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name) or "_"


def ledger_path(directory: str | os.PathLike[str], job: str, host: str | None = None) -> Path:
    """The ledger file of ``job`` on this node (``host``, default: this machine)."""
    return Path(directory) / f"{_safe(job)}.{_safe(host or socket.gethostname())}.jsonl"


def host_ledger_files(directory: str | os.PathLike[str], host: str | None = None) -> list[Path]:
    """Every job's ledger file written on ``host`` (default: this machine) in ``directory``.

    The file naming of :func:`ledger_path` read back: a node's sensor follows exactly the files
    its own processes write. An unreadable directory gives no files.
    """
    suffix = f".{_safe(host or socket.gethostname())}.jsonl"
    try:
        return sorted(p for p in Path(directory).iterdir() if p.name.endswith(suffix))
    except OSError as exc:
        logger.debug("cannot list the ledger directory %s: %s", directory, exc)
        return []


class Recorder:
    """Writes goodput events of one process to the node's ledger file.

    Args:
        directory: the job's ledger directory; None gives a disabled recorder (every call is a
            cheap no-op).
        job: job id (default "default").
        node: node name written into events (default: the host name).
        rank: global rank of this process; None for a process that is no rank (the launcher).
            ``step()`` records only for rank 0 or None.
        attempt: restart count (default 0).
        step_interval_s: at most one ``step`` event per this many seconds (plus the last step
            before every flush).
        flush_interval_s: how often the background thread writes the queued events.
        max_queue: queued events that wake the writer early.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str] | None,
        *,
        job: str | None = None,
        node: str | None = None,
        rank: int | None = None,
        attempt: int | None = None,
        step_interval_s: float = 1.0,
        flush_interval_s: float = 1.0,
        max_queue: int = 1000,
    ) -> None:
        self.directory = None if directory is None else Path(directory)
        self.job = job or "default"
        self.node = node or socket.gethostname()
        self.rank = rank
        self.attempt = attempt or 0
        self.path = None if self.directory is None else ledger_path(self.directory, self.job)
        self._step_interval = float(step_interval_s)
        self._flush_interval = float(flush_interval_s)
        self._max_queue = max_queue
        self._queue: deque[tuple[str, float, float | None, dict[str, Any]]] = deque()
        self._pending: tuple[int, float] | None = None
        self._pending_written: tuple[int, float] | None = None
        self._next_step = 0.0
        self._offset = time.time() - time.monotonic()
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._fd: int | None = None
        self._closed = False
        self._enabled = self.directory is not None
        self._steps = self._enabled and rank in (None, 0)
        if self._enabled:
            _live.add(self)

    @property
    def enabled(self) -> bool:
        """True when events go to a ledger; False for a no-op recorder."""
        return self._enabled

    def step(self, n: int) -> None:
        """Record that training step ``n`` finished (sampled; rank 0 only; never blocks)."""
        if self._steps:
            now = time.monotonic()
            if now < self._next_step:
                self._pending = (n, now)
                return
            self._next_step = now + self._step_interval
            self._pending = self._pending_written = (n, now)
            self._enqueue("step", now, None, {"step": n})

    def emit(self, event: str, **fields: Any) -> None:
        """Record one event of type ``event`` with its fields (see `EVENT_TYPES`).

        An unknown type or a bad field is logged (rate-limited) and the event dropped.
        """
        if not self._enabled:
            return
        problem = validate_fields(event, fields)
        if problem is not None:
            _warn("invalid:" + event, f"dropped an event: {problem}")
            return
        self._enqueue(event, time.monotonic(), time.time(), fields)

    def rename(self, node: str) -> None:
        """Write later events under ``node`` (those queued so far keep the old name)."""
        if node != self.node:
            self.flush()
            self.node = node

    def flush(self) -> None:
        """Write every queued event now (on the calling thread)."""
        if not self._enabled:
            return
        try:
            self._write_queued()
        except Exception as exc:  # never into training
            _warn("flush", f"cannot write {self.path}: {exc!r}")

    def close(self) -> None:
        """Flush, stop the writer thread and close the file; later calls are no-ops."""
        if not self._enabled:
            return
        self._closed = True
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            self._wake.set()
            thread.join(timeout=5.0)
            if thread.is_alive():
                _warn("close", "the writer thread did not stop within 5 s")
        self.flush()
        self._enabled = self._steps = False
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    # -- internals ------------------------------------------------------------------------------

    def _enqueue(self, event: str, mono: float, wall: float | None, fields: dict[str, Any]) -> None:
        self._queue.append((event, mono, wall, fields))
        if self._thread is None:
            self._start_thread()
        elif len(self._queue) >= self._max_queue:
            self._wake.set()

    def _start_thread(self) -> None:
        if self._closed:
            return
        self._thread = threading.Thread(target=self._run, name="goodput-recorder", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._closed:
            self._wake.wait(self._flush_interval)
            self._wake.clear()
            self.flush()

    def _line(self, event: str, mono: float, wall: float | None, fields: dict[str, Any]) -> str:
        if wall is None:
            wall = mono + self._offset
        record = {
            "schema": SCHEMA_VERSION,
            "job": self.job,
            "event": event,
            "time": datetime.fromtimestamp(wall, timezone.utc).isoformat(timespec="microseconds"),
            "mono": round(mono, 6),
            "node": self.node,
            "rank": self.rank,
            "attempt": self.attempt,
            **fields,
        }
        return json.dumps(record, separators=(",", ":"), default=str) + "\n"

    def _write_queued(self) -> None:
        with self._lock:
            pending = self._pending
            if pending is not None and pending is not self._pending_written:
                self._pending_written = pending
                self._queue.append(("step", pending[1], None, {"step": pending[0]}))
            self._offset = time.time() - time.monotonic()
            lines: list[str] = []
            size = 0
            while self._queue:
                line = self._line(*self._queue.popleft())
                lines.append(line)
                size += len(line)
                if size >= MAX_BATCH_BYTES:
                    self._write("".join(lines).encode())
                    lines, size = [], 0
            if lines:
                self._write("".join(lines).encode())

    def _write(self, data: bytes) -> None:
        if self._fd is None:
            assert self.path is not None
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        view = memoryview(data)
        while view:  # one write for a regular file; a short write only on a full disk
            written = os.write(self._fd, view)
            view = view[written:]

    def _after_fork(self) -> None:
        """In a forked child (a data-loader worker): forget the parent's queue and thread."""
        self._queue = deque()
        self._thread = None
        self._lock = threading.Lock()
        self._wake = threading.Event()
        self._fd = None


_recorder: Recorder | None = None
_recorder_env: tuple[str | None, ...] | None = None
_recorder_lock = threading.Lock()


def _env_int(name: str) -> int | None:
    value = os.environ.get(name)
    try:
        return None if value is None else int(value)
    except ValueError:
        _warn("env:" + name, f"ignoring {name}={value!r} (not an integer)")
        return None


def get_recorder() -> Recorder:
    """The process-wide recorder, configured from the environment and cached.

    ``RESILIENCY_GOODPUT_DIR`` (unset: disabled), job from ``RESILIENCY_JOB_ID`` or
    ``TORCHELASTIC_RUN_ID``, node from ``GROUP_RANK`` or the host name, rank from ``RANK``,
    attempt from ``TORCHELASTIC_RESTART_COUNT``. A changed environment gives a new recorder.
    """
    global _recorder, _recorder_env
    names = (DIR_ENV, *JOB_ENVS, "GROUP_RANK", "RANK", "TORCHELASTIC_RESTART_COUNT")
    env = tuple(os.environ.get(name) for name in names)
    with _recorder_lock:
        if _recorder is None or env != _recorder_env:
            if _recorder is not None:
                _recorder.close()
            directory = os.environ.get(DIR_ENV) or None
            job = next((os.environ[n] for n in JOB_ENVS if os.environ.get(n)), None)
            _recorder = Recorder(
                directory,
                job=job,
                node=os.environ.get("GROUP_RANK") or None,
                rank=_env_int("RANK"),
                attempt=_env_int("TORCHELASTIC_RESTART_COUNT"),
            )
            _recorder_env = env
        return _recorder


def _close_all() -> None:
    for recorder in list(_live):
        try:
            recorder.close()
        except Exception as exc:  # at exit: log, never raise
            _warn("atexit", f"could not flush at exit: {exc!r}")


def _after_fork_in_child() -> None:
    for recorder in list(_live):
        recorder._after_fork()


atexit.register(_close_all)
os.register_at_fork(after_in_child=_after_fork_in_child)
