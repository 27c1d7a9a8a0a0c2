"""The rank's side of its monitor process: a beat thread and the process that watches it.

NVRx runs a monitor process beside each rank, for the hang no thread of the rank can end: a main
thread stuck in a C call that holds the GIL. The monitor thread cannot run then, and no signal
handler either (CPython runs them on the main thread). Here a small thread writes one byte to a
pipe every ``monitor_process_interval``; it can only do so while the GIL is free. The monitor
process (``_monitor_process_main``, standard library only: a few milliseconds to start) ends
the rank once the beats stop for ``hard_timeout``: under ``ft-launcher --ft-inprocess-respawn``
it first writes the launcher's respawn request, so the rank is respawned alone and healed like a
SIGKILLed one. Just before, ``faulthandler``'s own C watchdog thread (re-armed at every beat,
and able to run without the GIL) dumps every thread's stack to stderr: where it hung.
"""

from __future__ import annotations

import contextlib
import faulthandler
import logging
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path

from resiliency.inprocess.exception import ConfigError

log = logging.getLogger(__name__)

#: The monitor process's entry, run by its path (see its docstring).
ENTRY = Path(__file__).with_name("_monitor_process_main.py")
#: The last byte a rank writes: its wrapped call is over (the entry's ``_STOP``; the entry
#: imports nothing of this package, so the byte is written out on both sides and
#: tests/inprocess/test_monitor_process.py holds them together).
STOP = b"x"
#: Between these two bytes the monitor process ends no rank (the entry's ``_SUSPEND`` and
#: ``_RESUME``): ``CallWrapper.disable_hang_protection()``.
SUSPEND = b"s"
RESUME = b"r"


class MonitorProcess:
    """Start the monitor process and the beat thread; ``close()`` ends both.

    Args:
        rank: the rank, for the monitor process's messages.
        timeouts: the Wrapper's, in seconds: ``monitor_process_interval`` between beats,
            ``hard_timeout`` without one before the rank is ended, ``termination_grace_time``
            between its SIGTERM and SIGKILL.
        respawn_request: where the launcher expects a respawn request, or None.
        logfile: the Wrapper's ``monitor_process_logfile`` (``{rank}`` replaced), or None for
            the rank's stderr.
        pidfile: the Wrapper's ``monitor_process_pidfile`` (``{rank}`` replaced): the monitor
            process's pid is written there (whole: a temporary file renamed), or None.

    Raises:
        ConfigError: the pid file cannot be written (its path is in the message).
    """

    def __init__(
        self,
        *,
        rank: int,
        timeouts: dict[str, float],
        respawn_request: Path | None,
        logfile: str | None,
        pidfile: str | None = None,
    ) -> None:
        interval, limit = timeouts["monitor_process_interval"], timeouts["hard_timeout"]
        grace = timeouts["termination_grace_time"]
        self.interval = interval
        # The stack dump comes a little before the kill, which the monitor process sends on its
        # first check past the limit.
        self._dump_after = max(limit - min(interval, 1.0), interval)
        read_end, self._write_end = os.pipe()
        os.set_blocking(self._write_end, False)
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    str(ENTRY),
                    str(read_end),
                    str(os.getpid()),
                    str(rank),
                    f"{interval:g}",
                    f"{limit:g}",
                    f"{grace:g}",
                    "-" if respawn_request is None else str(respawn_request),
                    "-" if logfile is None else logfile.replace("{rank}", str(rank)),
                ],
                pass_fds=[read_end],
                stdin=subprocess.DEVNULL,
                close_fds=True,
            )
        except BaseException:
            os.close(self._write_end)
            raise
        finally:
            os.close(read_end)
        if pidfile is not None:
            self._write_pidfile(pidfile.replace("{rank}", str(rank)))
        self._halt = threading.Event()
        self._suspended = 0  # nesting depth of disable_hang_protection()
        self._arming = threading.Lock()  # a beat never re-arms the dump a suspend just cancelled
        self._thread = threading.Thread(
            target=self._beat, name=f"inprocess-monitor-process-beat-{rank}", daemon=True
        )
        self._thread.start()
        log.debug("rank %d: monitor process started (pid %d)", rank, self._proc.pid)

    def _write_pidfile(self, path: str) -> None:
        temporary = f"{path}.{os.getpid()}.tmp"
        try:
            with open(temporary, "w", encoding="ascii") as out:
                out.write(f"{self._proc.pid}\n")
            os.replace(temporary, path)
        except OSError as exc:
            self._proc.kill()
            self._proc.wait(5.0)
            os.close(self._write_end)
            raise ConfigError(
                f"Wrapper(monitor_process_pidfile=...): cannot write the monitor process's pid "
                f"to {path!r} ({exc}); give a path in a writable directory"
            ) from exc

    def suspend(self) -> None:
        """Stop ending the rank for a silence until ``resume()`` (calls nest)."""
        with self._arming:
            self._suspended += 1
            faulthandler.cancel_dump_traceback_later()
        if self._suspended == 1:
            self._send(SUSPEND)

    def resume(self) -> None:
        """End the protection's pause begun by the matching ``suspend()``."""
        self._suspended -= 1
        if self._suspended == 0:
            self._send(RESUME)

    def _send(self, byte: bytes) -> None:
        """Write a control byte, waiting for room in a pipe full of beats (not dropped as a beat
        may be: the monitor process must see every one)."""
        deadline = time.monotonic() + 5.0
        while True:
            try:
                os.write(self._write_end, byte)
                return
            except BlockingIOError:
                if time.monotonic() > deadline:
                    log.error("the monitor process reads no beats; %r not sent", byte)
                    return
                select.select([], [self._write_end], [], 0.1)
            except OSError as exc:
                log.error("the in-process monitor process is gone (%s); %r not sent", exc, byte)
                return

    def _beat(self) -> None:
        while not self._halt.is_set():
            with self._arming:
                if not self._suspended:
                    faulthandler.dump_traceback_later(self._dump_after, exit=False)
            try:
                os.write(self._write_end, b".")
            except BlockingIOError:
                pass  # the pipe is full of unread beats: the monitor process has plenty
            except OSError as exc:  # it is gone: nothing watches this rank for GIL hangs now
                log.error(
                    "the in-process monitor process is gone (%s); GIL hangs go unwatched", exc
                )
                return
            self._halt.wait(self.interval)

    def close(self) -> None:
        """Stop beating and let the monitor process end (the pipe's EOF)."""
        self._halt.set()
        self._thread.join(self.interval + 1.0)
        faulthandler.cancel_dump_traceback_later()
        try:
            os.write(self._write_end, STOP)  # not only EOF: a forked child may hold the pipe
        except OSError as exc:  # full of beats (it reads them first) or gone: EOF still ends it
            log.debug("could not send the monitor process its stop byte: %s", exc)
        os.close(self._write_end)
        try:
            self._proc.wait(timeout=5.0)
        except subprocess.TimeoutExpired:
            log.error("the in-process monitor process %d did not end; killing it", self._proc.pid)
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            self._proc.wait(timeout=5.0)
