"""The rank side's hot path: heartbeats and section events as non-blocking sends.

Each call builds one small frame from a pre-encoded prefix and hands it to the kernel with
``MSG_DONTWAIT``. It never waits for the monitor and never raises into the training loop: when the
socket buffer is full, heartbeats are dropped (the next one carries the same news) and section
events wait in a bounded backlog; when the monitor is gone, one error is logged and every call
becomes a no-op.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from collections import deque
from typing import Any

from resiliency.ft import _peer
from resiliency.ft.errors import ProtocolError
from resiliency.ft.protocol import section_frame_prefix

logger = logging.getLogger(__name__)

#: Section events waiting for room in the socket; beyond this the client resynchronizes.
MAX_BACKLOG = 512
COLD_TIMEOUT_S = 10.0
# MSG_NOSIGNAL: a program that restored SIGPIPE's default action must not die on a dead monitor.
_SEND_FLAGS = socket.MSG_DONTWAIT | socket.MSG_NOSIGNAL
_monotonic = time.monotonic


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "")
    return int(value) if value.strip().lstrip("-").isdigit() else None


class HotPath:
    """Heartbeat and section calls over a connected monitor socket (``self._sock``)."""

    def __init__(self) -> None:
        self._sock: socket.socket | None = None
        self._path: str | None = None
        self._rank = _env_int("RANK")
        self._local_rank = _env_int("LOCAL_RANK")
        self._gone = False
        self._backlog: deque[bytes] = deque()
        # Open sections, in opening order (a dict is an ordered set).
        self._open: dict[str, None] = {}
        self._ss: dict[str, bytes] = {}
        self._se: dict[str, bytes] = {}
        self._warned: set[str] = set()

    def _who(self) -> str:
        if self._rank is not None:
            return f"rank {self._rank}"
        return "this rank" if self._local_rank is None else f"local rank {self._local_rank}"

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._backlog.clear()

    def _warn_once(self, key: str, message: str, *args: Any) -> None:
        if key not in self._warned:
            self._warned.add(key)
            logger.warning(message, *args)

    def _monitor_gone(self, exc: OSError) -> None:
        logger.error(
            "rank monitor for %s at %s is gone (%s); hang detection is OFF for this rank",
            self._who(),
            self._path,
            exc.strerror or exc,
        )
        self._gone = True
        self._close()

    def _not_connected(self, call: str) -> None:
        if not self._gone:
            self._warn_once("init", "%s() called before init_workload_monitoring(); ignored", call)

    def send_heartbeat(self) -> None:
        """Report progress. Never blocks, never raises."""
        sock = self._sock
        if sock is None:
            self._not_connected("send_heartbeat")
            return
        if self._backlog and not self._flush_backlog():
            return  # the monitor is behind: this heartbeat is redundant with the queued events
        try:
            sock.send(b'{"t":"hb","ts":%.6f}' % _monotonic(), _SEND_FLAGS)
        except BlockingIOError:
            pass  # the monitor is behind; the next heartbeat carries the same news
        except OSError as exc:
            self._monitor_gone(exc)

    def _prefixes(self, name: str) -> bytes | None:
        try:
            start = section_frame_prefix("ss", name)
            end = section_frame_prefix("se", name)
        except ProtocolError as exc:
            self._warn_once(f"badname:{name!r:.80}", "%s: section ignored: %s", self._who(), exc)
            return None
        self._ss[name] = start
        self._se[name] = end
        return start

    # start_section/end_section inline the send of _send_section_event: a method call is a
    # measurable share of a ~3 us budget.

    def start_section(self, name: str) -> None:
        """Open section ``name``. Never blocks, never raises.

        Args:
            name: The section name (1 to 256 characters); sections may nest.
        """
        if self._sock is None:
            self._not_connected("start_section")
            return
        if name in self._open:
            self._warn_once(f"open:{name}", "section %r started again while open; ignored", name)
            return
        prefix = self._ss.get(name) or self._prefixes(name)
        if prefix is None:
            return
        self._open[name] = None
        self._send_section_event(prefix + b"%.6f}" % _monotonic())

    def end_section(self, name: str) -> None:
        """Close section ``name``. Never blocks, never raises.

        Args:
            name: A section opened by :meth:`start_section`.
        """
        if self._sock is None:
            self._not_connected("end_section")
            return
        if name not in self._open:
            self._warn_once(f"closed:{name}", "section %r ended but it is not open; ignored", name)
            return
        del self._open[name]
        self._send_section_event(self._se[name] + b"%.6f}" % _monotonic())

    def end_all_sections(self) -> None:
        """Close every open section. Never blocks, never raises."""
        if self._sock is None:
            self._not_connected("end_all_sections")
            return
        self._open.clear()
        self._send_section_event(b'{"t":"sa","ts":%.6f}' % _monotonic())

    def _send_section_event(self, frame: bytes) -> None:
        sock = self._sock
        if sock is None:
            return
        if self._backlog:
            self._enqueue(frame)
            self._flush_backlog()
            return
        try:
            sock.send(frame, _SEND_FLAGS)
        except BlockingIOError:
            self._enqueue(frame)
        except OSError as exc:
            self._monitor_gone(exc)

    def _enqueue(self, frame: bytes) -> None:
        if len(self._backlog) < MAX_BACKLOG:
            self._backlog.append(frame)
            return
        # Rather than lose a section end (which would look like a hang), replace the backlog by
        # the current truth: close everything, reopen what is open now.
        self._warn_once(
            "backlog",
            "%s: the rank monitor is more than %d section events behind; resynchronizing "
            "(open sections restart their timers)",
            self._who(),
            MAX_BACKLOG,
        )
        now = _monotonic()
        self._backlog.clear()
        self._backlog.append(b'{"t":"sa","ts":%.6f}' % now)
        self._backlog.extend(self._ss[name] + b"%.6f}" % now for name in self._open)

    def _flush_backlog(self) -> bool:
        """Send queued section events; return True once the backlog is empty."""
        sock = self._sock
        backlog = self._backlog
        while backlog and sock is not None:
            try:
                sock.send(backlog[0], _SEND_FLAGS)
            except BlockingIOError:
                return False
            except OSError as exc:
                self._monitor_gone(exc)
                return False
            backlog.popleft()
        return not backlog

    def _drain_backlog(self) -> None:
        """Send every queued section event, waiting for room (cold path only)."""
        sock = self._sock
        while self._backlog and sock is not None:
            _peer.send_message_raw(sock, self._backlog[0], COLD_TIMEOUT_S)
            self._backlog.popleft()
