"""One rank monitor per local rank, owned by the launcher for the whole job.

Monitors start before the first workers, stay up across restarts (they keep the observed timings
that calculated timeouts are built from), learn every new worker's pid, and are stopped, with
their private socket directory removed, when the launcher exits. A monitor that dies is replaced
at once and the worker group it watched is failed: the worker's client cannot reconnect, so
letting it run on would leave it unmonitored.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from resiliency.ft import (
    IPC_SOCKET_ENV,
    FaultToleranceConfig,
    FaultToleranceError,
    MonitorEvent,
    MonitorProcess,
    create_socket_dir,
    socket_path_for,
)

__all__ = ["MONITOR_SOCKET_ENV", "MonitorSet"]

logger = logging.getLogger(__name__)

_DIR_PREFIX = "ftl-"

MONITOR_SOCKET_ENV = IPC_SOCKET_ENV


class MonitorSet:
    """The rank monitors of this node, one per local rank.

    Args:
        cfg: the configuration every monitor runs with.
        local_world_size: number of local ranks.
        base_dir: where the private (0700) socket directory is created; ``$TMPDIR`` if None.
    """

    def __init__(
        self, cfg: FaultToleranceConfig, local_world_size: int, base_dir: str | None = None
    ) -> None:
        self.check_socket_paths(local_world_size, base_dir)
        self.cfg = cfg
        self.local_world_size = local_world_size
        self.directory = create_socket_dir(prefix=_DIR_PREFIX, base_dir=base_dir)
        self._monitors: dict[int, MonitorProcess] = {}
        self._listeners: list[Callable[[MonitorEvent], None]] = []

    @staticmethod
    def check_socket_paths(local_world_size: int, base_dir: str | None = None) -> None:
        """Check, before anything starts, that every monitor socket path will fit.

        Args:
            local_world_size: number of local ranks.
            base_dir: where the socket directory will be created; ``$TMPDIR`` if None.

        Raises:
            ConfigError: the longest socket path is too long for a Unix socket (set TMPDIR
                to a shorter directory).
        """
        # mkdtemp appends 8 random characters to the prefix.
        longest = Path(base_dir or tempfile.gettempdir()) / (_DIR_PREFIX + "x" * 8)
        socket_path_for(longest, max(local_world_size - 1, 0))

    def socket_path(self, local_rank: int) -> str:
        """Return the monitor socket path of ``local_rank`` (what the worker gets in its env)."""
        return str(socket_path_for(self.directory, local_rank))

    def _start_one(self, local_rank: int) -> MonitorProcess:
        path = self.socket_path(local_rank)
        if os.path.lexists(path):
            os.unlink(path)  # left behind by a monitor that was killed
        monitor = MonitorProcess.start(self.cfg, path, local_rank)
        self._monitors[local_rank] = monitor
        return monitor

    def start_all(self) -> None:
        """Start every monitor that is not running yet (idempotent).

        The monitors start concurrently: each one spends most of its start-up importing Python,
        so starting them one after another would delay the first workers by that much per rank.

        Raises:
            FaultToleranceError: A monitor could not start (the others that did are kept).
        """
        missing = [
            local_rank
            for local_rank in range(self.local_world_size)
            if local_rank not in self._monitors or not self._monitors[local_rank].is_alive()
        ]
        if len(missing) <= 1:
            for local_rank in missing:
                self._start_one(local_rank)
            return
        with ThreadPoolExecutor(max_workers=len(missing), thread_name_prefix="ft-monitor") as pool:
            for future in [pool.submit(self._start_one, lr) for lr in missing]:
                future.result()

    def worker_started(
        self, local_rank: int, pid: int, rank: int | None, restart: int, *, watch_startup: bool
    ) -> None:
        """Tell the monitor of ``local_rank`` about its new worker.

        Args:
            local_rank: The worker's local rank.
            pid: Its pid.
            rank: Its global rank.
            restart: How many restarts came before.
            watch_startup: Whether ``rank_startup_timeout`` applies from the spawn on (else only
                once :meth:`arm_startup` is called).
        """
        try:
            self._monitors[local_rank].worker_started(
                pid, rank=rank, restart=restart, watch_startup=watch_startup
            )
        except FaultToleranceError as exc:
            # Died between start_all() and now: a fresh monitor must watch this worker.
            logger.error("monitor of local rank %d is gone (%s); restarting it", local_rank, exc)
            self.replace(local_rank)
            self._monitors[local_rank].worker_started(
                pid, rank=rank, restart=restart, watch_startup=watch_startup
            )

    def arm_startup(self, local_ranks: list[int]) -> None:
        """Make the monitors of ``local_ranks`` enforce ``rank_startup_timeout`` from now on."""
        for local_rank in local_ranks:
            monitor = self._monitors.get(local_rank)
            if monitor is None or not monitor.is_alive():
                continue
            try:
                monitor.arm_startup()
            except (FaultToleranceError, OSError) as exc:
                logger.warning("cannot arm the startup timer of local rank %d: %s", local_rank, exc)

    def workers_stopped(self) -> None:
        """Tell every monitor that the launcher is stopping the workers on purpose."""
        for local_rank, monitor in self._monitors.items():
            if not monitor.is_alive():
                continue
            try:
                monitor.worker_stopped()
            except (FaultToleranceError, OSError) as exc:
                logger.warning("cannot disarm monitor of local rank %d: %s", local_rank, exc)

    def request_stack_dump(self, local_rank: int) -> bool:
        """Ask the monitor of ``local_rank`` for its worker's stacks (a ``stacks`` event follows).

        Returns:
            True if the request reached the monitor.
        """
        try:
            self._monitors[local_rank].request_stack_dump()
        except (KeyError, FaultToleranceError, OSError) as exc:
            logger.debug("no stack dump from local rank %d: %s", local_rank, exc)
            return False
        return True

    def dead_monitors(self) -> list[int]:
        """Return the local ranks whose monitor process has died."""
        return [lr for lr, m in sorted(self._monitors.items()) if not m.is_alive()]

    def replace(self, local_rank: int) -> None:
        """Start a fresh monitor for ``local_rank`` after its monitor died."""
        old = self._monitors.pop(local_rank, None)
        if old is not None:
            try:
                old.stop(timeout=1.0)
            except (FaultToleranceError, OSError) as exc:
                logger.debug("cleaning up dead monitor of local rank %d: %s", local_rank, exc)
        self._start_one(local_rank)

    def poll_events(self) -> list[MonitorEvent]:
        """Return the events every live monitor has reported since the last call."""
        events: list[MonitorEvent] = []
        for local_rank, monitor in sorted(self._monitors.items()):
            if not monitor.is_alive():
                continue
            try:
                events.extend(monitor.poll_events(timeout=0.0))
            except (FaultToleranceError, OSError) as exc:
                logger.warning("cannot read monitor events of local rank %d: %s", local_rank, exc)
        for listener in self._listeners:
            for event in events:
                listener(event)
        return events

    def add_listener(self, listener: Callable[[MonitorEvent], None]) -> None:
        """Call ``listener`` with every event :meth:`poll_events` returns (on its thread)."""
        self._listeners.append(listener)

    def watch_status(self) -> dict[int, tuple[float | None, str | None]]:
        """Ask every live monitor what it sees now: local rank -> (heartbeat age, open section).

        A cold request per monitor (for the supervisor's status, once per interval); a monitor
        that does not answer is left out.
        """
        status: dict[int, tuple[float | None, str | None]] = {}
        for local_rank, monitor in sorted(dict(self._monitors).items()):
            try:
                watch = monitor.watch_status()
            except (FaultToleranceError, OSError) as exc:
                logger.debug("no watch status from local rank %d: %s", local_rank, exc)
                continue
            if watch:
                status[local_rank] = (watch.get("hb_age"), watch.get("section"))
        return status

    def stop_all(self) -> None:
        """Stop every monitor and remove the socket directory."""
        for local_rank, monitor in sorted(self._monitors.items()):
            try:
                monitor.stop(timeout=5.0)
            except (FaultToleranceError, OSError) as exc:
                logger.warning("stopping monitor of local rank %d failed: %s", local_rank, exc)
        self._monitors.clear()
        try:
            # The directory is flat: sockets and stack-dump files only.
            for entry in self.directory.iterdir():
                entry.unlink(missing_ok=True)
            self.directory.rmdir()
        except FileNotFoundError:
            return
        except OSError as exc:
            logger.warning("cannot remove the monitor socket directory %s: %s", self.directory, exc)
