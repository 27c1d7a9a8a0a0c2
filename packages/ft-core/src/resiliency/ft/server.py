"""RankMonitorServer: the process that watches one local rank and kills it when it hangs.

One monitor runs per local rank, started by the launcher (see :class:`resiliency.ft.MonitorProcess`)
before the worker and kept across worker restarts::

    python -m resiliency.ft.server --socket DIR/rank-0.sock --local-rank 0 --config-json '{...}'

It is a single-threaded ``selectors`` loop. It sleeps until the nearest timer deadline (at most
``workload_check_interval``), drains every connection, and drives the hang escalation (stack dump,
termination signal, SIGKILL) as a non-blocking state machine. No exception ends the loop: every
iteration is guarded and failures are logged with their traceback.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any

from resiliency.ft._conn import Conn
from resiliency.ft._durations import format_limit, format_timeouts
from resiliency.ft._hang_action import HangAction
from resiliency.ft._loop import SocketLoop
from resiliency.ft._proc import is_same_or_descendant, pid_alive, process_start_time
from resiliency.ft._rank_files import RankFiles
from resiliency.ft._rank_watch import ExpiredTimer, Observations, RankWatch
from resiliency.ft._server_args import parse_server_args
from resiliency.ft.config import FaultToleranceConfig
from resiliency.ft.errors import ConfigError, ProtocolError
from resiliency.ft.protocol import PROTOCOL_VERSION, mismatch_message
from resiliency.ft.timeouts import HeartbeatTimeouts, SectionTimeouts
from resiliency.ft.workload import WorkloadAction

__all__ = ["RankMonitorServer", "main"]

logger = logging.getLogger(__name__)

_MAX_OPEN_SECTIONS = 1024
_LIVENESS_EVERY_S = 0.5
_HOT = frozenset({"hb", "ss", "se", "sa"})


class RankMonitorServer(SocketLoop):
    """Watches one local rank's heartbeats and sections; dumps, terminates and kills it on a hang.

    Args:
        cfg: The configuration (timeouts, signals, grace periods).
        socket_path: Where to listen; its directory is created with mode 0700 if missing.
        local_rank: The local rank this monitor serves (for logs and file names).
        worker_pid: The worker's pid when known at start; arms the initial-heartbeat timer.

    Raises:
        ConfigError: The socket path is too long.
    """

    def __init__(
        self,
        cfg: FaultToleranceConfig,
        socket_path: str | os.PathLike[str],
        local_rank: int,
        *,
        worker_pid: int | None = None,
    ) -> None:
        super().__init__(socket_path)
        self.cfg = cfg
        self.local_rank = local_rank
        self.files = RankFiles(self.socket_path, local_rank)
        self.dump_path = self.files.dump_path
        self.hb_timeouts = HeartbeatTimeouts.from_config(cfg)
        self.section_timeouts = SectionTimeouts.from_config(cfg)
        self._obs = Observations()
        self._watch: RankWatch | None = None
        self._worker_pid: int | None = None
        self._worker_start_time: int | None = None
        self._generation = 0
        self._action: HangAction | None = None
        self._controller: Conn | None = None
        self._parent_pid = os.getppid()
        self._unwatched: set[str] = set()
        self._next_liveness = 0.0
        if worker_pid is not None:
            self._start_worker(worker_pid, None, time.monotonic())

    def bind(self) -> None:
        """Listen on the socket; create the rank's stack-dump file and termination mark beside it.

        Raises:
            ConfigError: The directory is not private, or another monitor listens on the path.
            OSError: The socket or the file cannot be created.
        """
        super().bind()
        self.files.create()

    def close(self) -> None:
        """Close every connection; remove the socket and the rank's files."""
        bound = self._listener is not None
        super().close()
        if bound:
            self.files.remove()

    # -- loop hooks ---------------------------------------------------------------------------

    def _next_wakeup(self, now: float) -> float:
        wake = now + self.cfg.workload_check_interval
        if self._action is not None:
            wake = min(wake, self._action.next_wakeup(now) or wake)
        elif self._watch is not None:
            deadline = self._watch.next_deadline(self.hb_timeouts, self.section_timeouts)
            if deadline is not None:
                wake = min(wake, deadline + 0.001)
            wake = min(wake, self._next_liveness)
        return wake

    def _tick(self, now: float) -> None:
        if os.getppid() != self._parent_pid:
            self.request_stop(f"parent process {self._parent_pid} is gone")
        if self._action is not None:
            self._action.poll(now)
            if self._action.done:
                self._action = None
            return
        watch = self._watch
        if watch is None:
            return
        if now >= self._next_liveness:
            self._next_liveness = now + _LIVENESS_EVERY_S
            if watch.pid is not None and not pid_alive(watch.pid, self._worker_start_time):
                logger.info("%s exited; its timers are disarmed", self._who())
                self._watch = None
                return
        expired = watch.expired(now, self.hb_timeouts, self.section_timeouts)
        if expired is not None:
            self._on_hang(expired, now)

    def _on_disconnect(self, conn: Conn) -> None:
        if conn is self._controller:
            self._controller = None
            self.request_stop("the controller (launcher) disconnected")
        elif conn.role == "rank":
            self._rank_disconnected(conn)

    # -- connections -------------------------------------------------------------------------

    def _emit(self, kind: str, **fields: Any) -> None:
        """Send an event to the controller, if one is connected."""
        if self._controller is None:
            return
        event = {"t": "event", "kind": kind, "local_rank": self.local_rank, **fields}
        dump = event.get("stack_dump")
        while True:
            try:
                self._send(self._controller, event)
                return
            except ProtocolError:
                if not dump:
                    raise
                # Too big for one frame: keep the head of the dump (the hung thread comes first).
                dump = dump[: len(dump) // 2]
                event["stack_dump"] = dump + "\n[... truncated to fit one message]"

    def _handshake(self, conn: Conn, msg: dict[str, Any]) -> None:
        if msg["t"] != "hello":
            self._refuse(conn, f"expected a 'hello' frame first, got {msg['t']!r}")
            return
        if msg["v"] != PROTOCOL_VERSION:
            self._refuse(conn, mismatch_message(msg["v"], PROTOCOL_VERSION), code="version")
            return
        if conn.creds.uid != os.geteuid():
            self._refuse(conn, f"uid {conn.creds.uid} is not the monitor's user ({os.geteuid()})")
            return
        if msg["role"] == "controller":
            refusal = self._admit_controller(conn)
        elif msg["role"] == "rank":
            refusal = self._admit_rank(conn, msg)
        else:
            refusal = f"unknown role {msg['role'][:40]!r}; expected 'rank' or 'controller'"
        if refusal is not None:
            self._refuse(conn, refusal)
            return
        conn.role = msg["role"]
        self._send(
            conn,
            {
                "t": "welcome",
                "v": PROTOCOL_VERSION,
                "cfg": json.loads(self.cfg.to_json()),
                "dump_path": str(self.dump_path),
                "timeouts": self._timeouts_dict(),
            },
        )
        if conn.role == "rank":
            logger.info("%s connected", self._who())
            self._emit("rank_connected", rank=msg.get("rank"), pid=conn.creds.pid)

    def _admit_controller(self, conn: Conn) -> str | None:
        if self._controller is not None:
            return "another controller is already connected to this monitor"
        if self._parent_pid > 1 and conn.creds.pid != self._parent_pid:
            return f"pid {conn.creds.pid} is not this monitor's parent ({self._parent_pid})"
        self._controller = conn
        return None

    def _admit_rank(self, conn: Conn, msg: dict[str, Any]) -> str | None:
        worker = self._worker_pid
        if worker is not None and self._controller is None and not pid_alive(worker):
            worker = None  # standalone monitor: the worker it knew is gone; adopt the next one
        if worker is not None and not is_same_or_descendant(conn.creds.pid, worker):
            return (
                f"pid {conn.creds.pid} is neither the worker this monitor watches "
                f"(pid {worker}) nor one of its children"
            )
        now = time.monotonic()
        if worker is None or self._watch is None:
            # Not announced yet (or reconnecting after 'bye'): this rank is the worker.
            self._start_worker(worker or conn.creds.pid, msg.get("rank"), now)
        if self._watch is not None:
            self._watch.on_connect(now)  # the initial-heartbeat timer starts here
            if msg.get("rank") is not None:
                self._watch.rank = msg["rank"]
        conn.generation = self._generation
        return None

    def _rank_disconnected(self, conn: Conn) -> None:
        watch = self._watch if conn.generation == self._generation else None
        self._emit("rank_disconnected", pid=conn.creds.pid, clean=conn.said_bye)
        if conn.said_bye or watch is None or self._action is not None:
            return
        if not pid_alive(conn.creds.pid):
            logger.info("%s exited without 'bye'; its timers are disarmed", self._who())
            self._watch = None
            return
        limit = watch.on_disconnect(time.monotonic(), self.hb_timeouts, self.section_timeouts)
        logger.info(
            "%s closed its connection without 'bye'; watching its exit (limit %s, no stack dump)",
            *(self._who(), format_limit(limit)),
        )

    # -- messages ----------------------------------------------------------------------------

    def _dispatch(self, conn: Conn, msg: dict[str, Any], now: float) -> None:
        t = msg["t"]
        if conn.role == "pending":
            self._handshake(conn, msg)
        elif conn.role == "rank" and t == "dump_ready":
            if conn.generation == self._generation and self._watch is not None:
                self._watch.dump_ready = True
        elif conn.role == "rank" and t in _HOT:
            self._on_hot(conn, t, msg.get("n"), msg["ts"], now)
        elif conn.role == "rank" and t == "stats":
            self._send(conn, {"t": "ok", "stats": self._obs.snapshot().to_dict()})
        elif conn.role == "rank" and t == "set_timeouts":
            self._set_timeouts(conn, msg)
        elif conn.role == "rank" and t == "wlc":
            self._forward_wlc(conn, msg)
        elif conn.role == "rank" and t == "bye":
            conn.said_bye = True
            if conn.generation == self._generation and self._watch is not None:
                logger.info("%s finished cleanly; its timers are disarmed", self._who())
                self._watch = None
            self._send(conn, {"t": "ok"})
        elif conn.role == "controller" and t == "worker_started":
            watch = msg.get("watch_startup", True)
            self._start_worker(msg["pid"], msg.get("rank"), now, msg.get("restart", 0), watch)
            self._send(conn, {"t": "ok"})
        elif conn.role == "controller" and t == "arm_startup":
            self._arm_startup()
            self._send(conn, {"t": "ok"})
        elif conn.role == "controller" and t == "worker_stopped":
            self._stop_worker()
            self._send(conn, {"t": "ok"})
        elif conn.role == "controller" and t == "dump_stacks":
            self._dump_stacks(now)
            self._send(conn, {"t": "ok"})
        elif conn.role == "controller" and t == "watch_status":
            watch = self._watch.status(now) if self._watch is not None else {}
            self._send(conn, {"t": "ok", "watch": watch})
        elif conn.role == "controller" and t == "shutdown":
            self._send(conn, {"t": "ok"})
            self.request_stop("the controller asked for shutdown")
        else:
            raise ProtocolError(f"unexpected {t!r} frame on a {conn.role} connection")

    def _on_hot(self, conn: Conn, t: str, name: str | None, ts: float, now: float) -> None:
        watch = self._watch
        if conn.generation != self._generation or watch is None:
            return  # a previous worker's late frames, or after 'bye'
        # A frame cannot predate its connection nor come from the future: clamp bogus timestamps
        # so that they can neither postpone a deadline nor expire a timer at once.
        ts = min(max(float(ts), conn.opened_at), now)
        if t == "hb":
            watch.on_heartbeat(ts)
        elif t == "ss":
            assert name is not None
            if len(watch.open_sections) >= _MAX_OPEN_SECTIONS:
                raise ProtocolError(
                    f"more than {_MAX_OPEN_SECTIONS} sections open; {name!r} ignored"
                )
            if name not in self._obs.sections and len(self._obs.sections) >= _MAX_OPEN_SECTIONS:
                raise ProtocolError(
                    f"more than {_MAX_OPEN_SECTIONS} section names; {name!r} ignored"
                )
            watch.on_section_start(name, ts)
            if self.section_timeouts.limit_for(name) is None and name not in self._unwatched:
                self._unwatched.add(name)
                logger.debug("section %r has no timeout; it is not watched", name)
        elif t == "se":
            assert name is not None
            if not watch.on_section_end(name, ts):
                logger.debug("%s ended section %r, which was not open", self._who(), name)
        else:
            watch.on_end_all(ts)

    def _set_timeouts(self, conn: Conn, msg: dict[str, Any]) -> None:
        hb = self.hb_timeouts = HeartbeatTimeouts.from_dict(msg["heartbeat"])
        sec = self.section_timeouts = SectionTimeouts.from_dict(msg["section"])
        limits = format_timeouts(hb.initial, hb.subsequent, sec.section, sec.out_of_section)
        logger.info("%s set timeouts: %s", self._who(), limits)
        self._send(conn, {"t": "ok"})

    def _forward_wlc(self, conn: Conn, msg: dict[str, Any]) -> None:
        action = WorkloadAction.parse(msg["action"])
        if action is WorkloadAction.Continue:  # nothing to do: the launcher goes on as usual
            logger.info("%s requests Continue: %s", self._who(), msg["desc"])
            self._send(conn, {"t": "ok", "forwarded": False})
            return
        logger.warning("%s requests %s: %s", self._who(), action.value, msg["desc"])
        if self._controller is None:
            undelivered = "no launcher is connected to this rank monitor; request not delivered"
            self._send(conn, {"t": "error", "msg": undelivered})
            return
        rank = self._watch.rank if self._watch is not None else None
        self._emit("wlc", action=action.value, desc=msg["desc"], rank=rank, pid=conn.creds.pid)
        self._send(conn, {"t": "ok", "forwarded": True})

    # -- workers and hangs -------------------------------------------------------------------

    def _who(self) -> str:
        watch = self._watch
        rank = watch.rank if watch is not None else None
        name = f"rank {rank}" if rank is not None else f"local rank {self.local_rank}"
        return f"{name} (pid {watch.pid})" if watch is not None else name

    def _timeouts_dict(self) -> dict[str, Any]:
        return {"heartbeat": self.hb_timeouts.to_dict(), "section": self.section_timeouts.to_dict()}

    def _start_worker(
        self, pid: int, rank: int | None, now: float, restart: int = 0, watch_startup: bool = True
    ) -> None:
        if pid == self._worker_pid and self._watch is not None and self._action is None:
            # The launcher announces a worker that already connected on its own: keep its state.
            self._watch.rank = rank if rank is not None else self._watch.rank
            return
        if self._action is not None:
            logger.warning("a new worker: the escalation on pid %d stops", self._action.pid)
            self._action.cancel()
            self._action = None
        self._generation += 1
        self._worker_pid = pid
        self._worker_start_time = process_start_time(pid)
        startup = self.cfg.rank_startup_timeout if watch_startup else None
        self._watch = RankWatch(pid, rank, now, self._obs, startup_timeout=startup)
        self._next_liveness = now + _LIVENESS_EVERY_S
        # Without watch_startup a worker that never connects is never a hang (plain torchrun).
        connect = "not required" if startup is None else f"within {format_limit(startup)} of spawn"
        initial = self.hb_timeouts.initial
        first = "no limit" if initial is None else f"within {format_limit(initial)} of connect"
        logger.info(
            "watching %s (restart %d); limits: connect %s, first heartbeat %s",
            *(self._who(), restart, connect, first),
        )

    def _arm_startup(self) -> None:
        """Start enforcing ``rank_startup_timeout`` on a worker started without it."""
        limit = self.cfg.rank_startup_timeout
        if self._watch is not None and limit is not None and self._watch.arm_startup(limit):
            logger.info(
                "%s: its peers connected; it must connect within %s of its spawn",
                *(self._who(), format_limit(limit)),
            )

    def _stop_worker(self) -> None:
        if self._action is not None:
            self._action.cancel()
            self._action = None
        if self._watch is not None:
            logger.info("the launcher stopped %s; its timers are disarmed", self._who())
        self._watch = None
        # The next worker may connect before the launcher announces it (a worker forked from a
        # pre-imported server starts in milliseconds): it is adopted, not refused as a stranger.
        self._worker_pid = None

    def _dump_stacks(self, now: float) -> None:
        """Collect the worker's stacks for the controller without stopping it (``stacks`` event).

        A hang action already under way dumps the stacks itself and reports them in its ``hang``
        event, so a request during one adds nothing (a second signal would race its dump file).
        """
        if self._action is not None:
            return
        watch = self._watch
        fields: dict[str, Any] = {
            "rank": watch.rank if watch else None,
            "pid": watch.pid if watch else None,
        }
        if watch is None or watch.pid is None or not watch.dump_ready:
            self._emit("stacks", **fields, stack_dump=None, msg="no connected worker to dump")
            return
        if not self.cfg.enable_stack_dump:
            self._emit("stacks", **fields, stack_dump=None, msg="stack dumps are disabled")
            return
        self._action = HangAction.from_config(
            self.cfg,
            pid=watch.pid,
            start_time=self._worker_start_time,
            who=self._who(),
            dump_path=self.dump_path,
            on_dump=lambda text: self._emit("stacks", **fields, stack_dump=text),
            on_done=lambda _sig: None,
            terminate=False,
        )
        self._action.start(now)
        if self._action.done:
            self._action = None

    def _on_hang(self, expired: ExpiredTimer, now: float) -> None:
        watch = self._watch
        assert watch is not None and watch.pid is not None
        who = self._who()
        logger.error("%s hung: %s [timer: %s]", who, expired.describe(), expired.timer)
        dump_path = self.dump_path if self.cfg.enable_stack_dump and watch.dump_ready else None
        if dump_path is None:
            reason = "disabled" if not self.cfg.enable_stack_dump else "no dump handler armed"
            logger.error("no stack dump of %s (%s)", who, reason)
        fields: dict[str, Any] = {"rank": watch.rank, "pid": watch.pid}

        def on_dump(text: str | None) -> None:
            if text:
                logger.error("stack dump of %s:\n%s", who, text.rstrip())
            self._emit(
                "hang",
                **fields,
                timer=expired.timer,
                elapsed=expired.elapsed,
                limit=expired.limit,
                stack_dump=text,
            )

        def on_done(sig: str | None) -> None:
            self._emit("killed", **fields, timer=expired.timer, signal=sig)
            if self._watch is watch:
                self._watch = None  # disarmed until the next worker_started

        self._action = HangAction.from_config(
            self.cfg,
            pid=watch.pid,
            start_time=self._worker_start_time,
            who=who,
            dump_path=dump_path,
            on_dump=on_dump,
            on_done=on_done,
            termination_mark=self.files.mark,
        )
        self._action.start(now)
        if self._action.done:
            self._action = None


def main(argv: list[str] | None = None) -> int:
    """Run a rank monitor until it is told to stop (the ``python -m`` entry point).

    Args:
        argv: Command-line arguments (default: ``sys.argv[1:]``).

    Returns:
        The exit code: 0 after a clean stop, 2 when the configuration or socket is unusable.
    """
    args = parse_server_args(argv)
    logging.basicConfig(
        level=logging.INFO,
        stream=sys.stderr,
        format=f"[ft-monitor local_rank={args.local_rank}] %(asctime)s %(levelname)s %(message)s",
        force=True,
    )
    try:
        cfg = FaultToleranceConfig.from_json(args.config_json)
        logging.getLogger().setLevel(cfg.log_level)
        server = RankMonitorServer(cfg, args.socket, args.local_rank, worker_pid=args.worker_pid)
        server.install_signal_handlers()
        server.bind()
    except (ConfigError, OSError) as exc:
        logger.error("cannot start the rank monitor: %s", exc)
        return 2
    return server.serve_forever()


if __name__ == "__main__":
    sys.exit(main())
