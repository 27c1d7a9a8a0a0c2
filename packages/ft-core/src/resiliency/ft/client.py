"""RankMonitorClient: what a training rank calls to report progress to its monitor.

The hot calls (:meth:`~RankMonitorClient.send_heartbeat`, :meth:`~RankMonitorClient.start_section`,
:meth:`~RankMonitorClient.end_section`, :meth:`~RankMonitorClient.end_all_sections`) each build one
small pre-encoded frame and hand it to the kernel with a non-blocking send: they never wait for the
monitor and never raise into the training loop. If the monitor is slow, heartbeats are dropped (the
next one carries the same news) and section events are queued; if it is gone, one clear error is
logged and the calls become no-ops.
"""

from __future__ import annotations

import faulthandler
import json
import logging
import os
import signal
import socket
import weakref
from collections.abc import Iterable
from types import TracebackType
from typing import IO, Any

from resiliency.ft import _peer
from resiliency.ft._distributed import all_agree, allreduce_max, distributed_initialized
from resiliency.ft._durations import format_limit, format_timeouts
from resiliency.ft._hot_path import COLD_TIMEOUT_S, HotPath
from resiliency.ft.config import FaultToleranceConfig
from resiliency.ft.errors import MonitorUnavailableError, ProtocolError
from resiliency.ft.fault_hook import install_fault_hook
from resiliency.ft.state import (
    describe_loaded_timeouts,
    merge_loaded_timeouts,
    timeouts_from_state_dict,
    timeouts_to_state_dict,
)
from resiliency.ft.timeouts import (
    HeartbeatTimeouts,
    ObservedIntervals,
    SectionTimeouts,
    calculate_heartbeat_timeouts,
    calculate_section_timeouts,
)
from resiliency.ft.workload import WorkloadControlRequest

__all__ = ["IPC_SOCKET_ENV", "RankMonitorClient"]

logger = logging.getLogger(__name__)

#: The environment variable that carries the monitor's socket path to the rank.
IPC_SOCKET_ENV = "FT_RANK_MONITOR_IPC_SOCKET"
_HANDSHAKE_TIMEOUT_S = 5.0
_REQUEST_TIMEOUT_S = COLD_TIMEOUT_S
_SEND_BUFFER_BYTES = 1 << 20

# Clients to disable in a forked child: the child shares the socket but is not the rank.
_LIVE_CLIENTS: weakref.WeakSet[RankMonitorClient] = weakref.WeakSet()


def _disable_in_child() -> None:
    for client in list(_LIVE_CLIENTS):
        client._forget_after_fork()


os.register_at_fork(after_in_child=_disable_in_child)


class RankMonitorClient(HotPath):
    """The rank's connection to its rank monitor.

    Attributes:
        cfg: The configuration the monitor runs with (set by :meth:`init_workload_monitoring`).
    """

    #: The state-dict key of the timeouts (the name NVIDIA's resiliency extension uses).
    CURRENT_TIMEOUTS_STATE_KEY = "current_timeouts"

    def __init__(self) -> None:
        super().__init__()
        self.cfg: FaultToleranceConfig | None = None
        self._hb = HeartbeatTimeouts()
        self._sections = SectionTimeouts()
        self._loaded: tuple[HeartbeatTimeouts, SectionTimeouts] | None = None
        self._dump_file: IO[str] | None = None

    # -- set-up and tear-down -----------------------------------------------------------------

    @property
    def is_initialized(self) -> bool:
        """True while connected to the monitor."""
        return self._sock is not None

    def init_workload_monitoring(self) -> None:
        """Connect to the monitor named by ``FT_RANK_MONITOR_IPC_SOCKET`` and register the dump.

        Raises:
            MonitorUnavailableError: The variable is not set or the monitor cannot be reached.
            MonitorRefusedError: The monitor refused this process.
            ProtocolVersionError: The monitor speaks another protocol version.
        """
        if self._sock is not None:
            logger.warning("init_workload_monitoring() called twice; already connected")
            return
        path = os.environ.get(IPC_SOCKET_ENV)
        if not path:
            raise MonitorUnavailableError(
                f"{IPC_SOCKET_ENV} is not set, so this process does not know its rank monitor: "
                "start the job with ft-launcher, or start a monitor "
                f"(resiliency.ft.MonitorProcess) and set {IPC_SOCKET_ENV} to its socket path"
            )
        hello = {
            "role": "rank",
            "pid": os.getpid(),
            "rank": self._rank,
            "local_rank": self._local_rank,
        }
        sock, welcome = _peer.connect(path, hello, _HANDSHAKE_TIMEOUT_S)
        try:
            self.cfg = FaultToleranceConfig.from_json(json.dumps(welcome["cfg"]))
            self._hb = HeartbeatTimeouts.from_dict(welcome["timeouts"]["heartbeat"])
            self._sections = SectionTimeouts.from_dict(welcome["timeouts"]["section"])
        except Exception:
            sock.close()
            raise
        try:
            # Room for bursts of section events while the monitor is busy (capped by the kernel).
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, _SEND_BUFFER_BYTES)
        except OSError as exc:
            logger.debug("cannot enlarge the monitor socket's send buffer: %s", exc)
        self._sock, self._path, self._gone = sock, path, False
        _LIVE_CLIENTS.add(self)
        self._register_stack_dump(welcome["dump_path"])
        install_fault_hook()  # a no-op unless resiliency-simulate asked for it
        if self._loaded is not None:
            self._apply_loaded(*self._loaded)
        logger.info("%s connected to its rank monitor at %s", self._who(), path)

    def _register_stack_dump(self, dump_path: str) -> None:
        cfg = self.cfg
        if cfg is None or not cfg.enable_stack_dump:
            return
        previous = signal.getsignal(cfg.stack_dump_signal)
        if previous not in (signal.SIG_DFL, None):
            logger.warning(
                "%s: the stack dump on a hang takes %s; the handler installed for it before "
                "(%r) no longer runs. Set stack_dump_signal to a signal the job does not use, "
                "or enable_stack_dump: false, to keep it",
                self._who(),
                cfg.stack_dump_signal.name,
                previous,
            )
        try:
            # Append mode: the monitor truncates the file before asking for a dump.
            self._dump_file = open(dump_path, "a", encoding="utf-8")  # noqa: SIM115
            faulthandler.register(
                cfg.stack_dump_signal, file=self._dump_file, all_threads=True, chain=False
            )
        except (OSError, ValueError, AttributeError, RuntimeError) as exc:
            logger.warning(
                "%s cannot register a stack dump on %s (%s); a hang will be reported without "
                "stacks",
                self._who(),
                cfg.stack_dump_signal.name,
                exc,
            )
            return
        self._send_section_event(b'{"t":"dump_ready"}')

    def _forget_after_fork(self) -> None:
        # The child's copy of the socket must not speak for the rank; close only the child's fd.
        if self._sock is not None:
            self._sock.close()
        self._sock = None
        self._gone = True

    def shutdown_workload_monitoring(self) -> None:
        """Tell the monitor this rank ends cleanly and disconnect (idempotent)."""
        sock = self._sock
        if sock is None:
            return
        try:
            self._drain_backlog()
            _peer.request(sock, {"t": "bye"}, 2.0)
        except (MonitorUnavailableError, ProtocolError) as exc:
            logger.debug("%s: 'bye' not acknowledged: %s", self._who(), exc)
        self._close()

    def _close(self) -> None:
        super()._close()
        if self._dump_file is not None and self.cfg is not None:
            if hasattr(faulthandler, "unregister"):
                faulthandler.unregister(self.cfg.stack_dump_signal)
            self._dump_file.close()
            self._dump_file = None

    def __enter__(self) -> RankMonitorClient:
        self.init_workload_monitoring()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Say goodbye after a clean block; after an exception, stay watched until the exit.

        A block that raises is a failing rank: its teardown (``destroy_process_group``, a
        stuck NCCL abort, atexit handlers) can still hang, and only its monitor can end that.
        So no 'bye' is sent and the stack-dump handler stays registered; the monitor keeps the
        rank's timers running until the process exits (then it disarms them on its own).
        """
        if exc_type is None or (isinstance(exc, SystemExit) and exc.code in (0, None)):
            self.shutdown_workload_monitoring()
        elif self._sock is not None:
            logger.warning(
                "%s: leaving the monitored block with %s; the monitor keeps watching this rank "
                "until the process exits",
                self._who(),
                exc_type.__name__,
            )

    # -- cold path ----------------------------------------------------------------------------

    def _request(self, msg: dict[str, Any]) -> dict[str, Any]:
        if self._sock is None:
            raise MonitorUnavailableError(
                f"{self._who()} is not connected to a rank monitor "
                "(call init_workload_monitoring() first; or the monitor is gone)"
            )
        self._drain_backlog()
        return _peer.request(self._sock, msg, _REQUEST_TIMEOUT_S)

    def _observed(self, process_group: Any) -> ObservedIntervals | None:
        """The intervals observed on every rank (max over the group); None when a rank could
        not read its own: then no rank runs the reduction, and each keeps its timeouts.

        Raises:
            MonitorUnavailableError, ProtocolError: this rank's request failed and there is no
                process group to agree with (a single process).
        """
        local: ObservedIntervals | None = None
        error: Exception | None = None
        try:
            self._safety_factor()
            local = ObservedIntervals.from_dict(self._request({"t": "stats"})["stats"])
        except (MonitorUnavailableError, ProtocolError, OSError) as exc:
            error = exc
        # One agreement first: a rank that failed must not skip a collective the others run.
        if not all_agree(error is None, process_group):
            if error is not None and not distributed_initialized():
                raise error
            reason = (
                f"this rank's monitor did not answer ({error})"
                if error is not None
                else "another rank could not read its monitor's statistics"
            )
            logger.warning("%s: %s; every rank keeps its timeouts", self._who(), reason)
            return None
        assert local is not None
        return ObservedIntervals.from_flat(allreduce_max(local.to_flat(), process_group))

    def _send_timeouts(self) -> None:
        if self._sock is not None:
            self._request(
                {
                    "t": "set_timeouts",
                    "heartbeat": self._hb.to_dict(),
                    "section": self._sections.to_dict(),
                }
            )

    @property
    def hb_timeouts(self) -> HeartbeatTimeouts | None:
        """The heartbeat timeouts in effect; None before :meth:`init_workload_monitoring`."""
        return None if self.cfg is None else self._hb

    @property
    def section_timeouts(self) -> SectionTimeouts | None:
        """The section timeouts in effect; None before :meth:`init_workload_monitoring`."""
        return None if self.cfg is None else self._sections

    def _safety_factor(self) -> float:
        if self.cfg is None:
            raise MonitorUnavailableError("call init_workload_monitoring() first")
        return self.cfg.safety_factor

    def calculate_and_set_hb_timeouts(
        self, skip_if_not_ready: bool = False, process_group: Any = None
    ) -> bool:
        """Set heartbeat timeouts from the intervals observed so far (max over all ranks).

        Call on every rank at the same point when torch.distributed is initialized.

        Args:
            skip_if_not_ready: accepted for NVIDIA's resiliency extension, where False makes
                "not enough data yet" an error. Here that case always returns False with a
                warning (never raises), whatever this argument says.
            process_group: the group whose ranks agree (default: the default group); every
                member calls this at the same point.

        Returns:
            True when the timeouts were calculated and the monitor uses them; False when no
            heartbeat has been observed yet, or when a rank could not read its monitor (every
            rank then keeps its timeouts, with a warning).

        Raises:
            MonitorUnavailableError: Not connected, or the monitor does not answer, in a single
                process (with torch.distributed the ranks agree instead, see above).
            ProtocolError: The monitor refused the new timeouts.
        """
        observed = self._observed(process_group)
        if observed is None:
            return False
        factor = self._safety_factor()
        if observed.initial is None and observed.heartbeat is None:
            logger.warning(
                "%s: no heartbeat observed yet; heartbeat timeouts unchanged", self._who()
            )
            return False
        floor = self.cfg.calculated_timeout_floor if self.cfg is not None else 0.0
        self._hb = calculate_heartbeat_timeouts(self._hb, observed, factor, floor)
        self._send_timeouts()
        limits = format_timeouts(self._hb.initial, self._hb.subsequent)
        logger.info("%s: calculated heartbeat timeouts: %s", self._who(), limits)
        return True

    def calculate_and_set_section_timeouts(
        self,
        selected_sections: Iterable[str] | None = None,
        calc_out_of_section: bool = True,
        skip_if_not_ready: bool = False,
        process_group: Any = None,
    ) -> bool:
        """Set section timeouts from the durations observed so far (max over all ranks).

        Args:
            selected_sections: Only these sections (default: every observed section).
            calc_out_of_section: Also calculate the out-of-section timeout.
            skip_if_not_ready: accepted for NVIDIA's resiliency extension; as for
                :meth:`calculate_and_set_hb_timeouts`, too little data returns False (with a
                warning) and never raises.
            process_group: as for :meth:`calculate_and_set_hb_timeouts`.

        Returns:
            True when at least one timeout was calculated and the monitor uses it; False as
            for :meth:`calculate_and_set_hb_timeouts`.

        Raises:
            MonitorUnavailableError: as for :meth:`calculate_and_set_hb_timeouts`.
            ProtocolError: The monitor refused the new timeouts.
        """
        observed = self._observed(process_group)
        if observed is None:
            return False
        factor = self._safety_factor()
        floor = self.cfg.calculated_timeout_floor if self.cfg is not None else 0.0
        updated = calculate_section_timeouts(
            self._sections, observed, factor, selected_sections, calc_out_of_section, floor=floor
        )
        if updated == self._sections and not observed.sections and observed.out_of_section is None:
            logger.warning("%s: no section observed yet; section timeouts unchanged", self._who())
            return False
        self._sections = updated
        self._send_timeouts()
        sections = ", ".join(f"{n} {format_limit(v)}" for n, v in updated.section.items())
        logger.info(
            "%s: calculated section timeouts: %s; out of section: %s",
            *(self._who(), sections or "none", format_limit(updated.out_of_section)),
        )
        return True

    def state_dict(self) -> dict[str, Any]:
        """Return the timeouts in effect, to save with a checkpoint (JSON-able).

        Returns:
            ``{"current_timeouts": {"heartbeat": {...}, "section": {...}}}``.
        """
        return timeouts_to_state_dict(self._hb, self._sections)

    def load_state_dict(self, state: Any) -> None:
        """Use timeouts saved by :meth:`state_dict` of an earlier job.

        Calculated values from the state win over the configuration; when connected, the monitor
        uses them at once, otherwise from :meth:`init_workload_monitoring` on.

        Args:
            state: A state dict as returned by :meth:`state_dict`.

        Raises:
            StateDictError: The state dict is malformed.
            MonitorUnavailableError: The monitor does not answer.
        """
        hb, sections = timeouts_from_state_dict(state)
        self._loaded = (hb, sections)
        if self._sock is not None:
            self._apply_loaded(hb, sections)

    def _apply_loaded(self, hb: HeartbeatTimeouts, sections: SectionTimeouts) -> None:
        cfg = self.cfg
        assert cfg is not None
        floor = cfg.calculated_timeout_floor
        configured = (HeartbeatTimeouts.from_config(cfg), SectionTimeouts.from_config(cfg))
        self._hb, self._sections = merge_loaded_timeouts(*configured, hb, sections, floor)
        used = (self._hb, self._sections)
        notes = describe_loaded_timeouts(
            cfg.model_fields_set, configured, (hb, sections), used, floor
        )
        if notes:
            # Precedence: a value calculated by an earlier job of this workload wins over the
            # configuration (as in NVIDIA's resiliency extension), never silently.
            logger.warning(
                "%s: timeouts calculated by an earlier job (loaded state) are used: %s. To use "
                "the configured values instead, start without the saved state",
                self._who(),
                "; ".join(notes),
            )
        self._send_timeouts()

    def send_workload_control_request(self, req: WorkloadControlRequest) -> None:
        """Ask the launcher, through the monitor, to shut the workload down or drop this node.

        Args:
            req: The request.

        Raises:
            MonitorUnavailableError: Not connected, or the monitor does not answer.
            ProtocolError: The monitor could not deliver it (no launcher connected).
        """
        self._request({"t": "wlc", "action": req.action.value, "desc": req.description})
