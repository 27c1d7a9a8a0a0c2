"""``--ft-inprocess-respawn``: a worker killed by a signal is respawned alone.

Without it, one dead worker makes torch's process context stop every other worker of the node
and the whole group restarts. With it, the agent looks at the workers *before* torch does (once
per monitoring interval): a worker that died of a signal (SIGKILL, a segfault, the OOM killer)
while the others still run is started again alone, with the same command, rank and environment
(forked from the ``--ft-preimport`` server when there is one), and the others are left running.
Their ``resiliency.inprocess.Wrapper`` sees the fault, aborts and waits at its restart barrier;
the new process's Wrapper joins that barrier as the same rank and is healed by its peers.

Bounds: each respawn counts against ``--max-restarts`` (with none left the group fails as
usual), and a respawned worker that has not joined within ``--ft-respawn-timeout`` (it writes
the file named by ``INPROCESS_REJOIN_FILE_ENV`` once it has) is killed: the group then restarts
the ordinary way. A worker that exited with a code (it left the job on purpose), that ended on
SIGTERM or SIGINT (asked to stop), or that its monitor killed as hung is never respawned alone.

One SIGTERM is respawned: the Wrapper's own, when it could not abort its rank in-process (the
main thread stuck in a C call past ``hard_timeout``). Every worker gets
``INPROCESS_UNABORTABLE_DIR_ENV``; such a Wrapper writes ``INPROCESS_UNABORTABLE_FILE`` for its
pid there before it terminates itself, and a worker that died of SIGTERM (or of the SIGKILL
after its grace time) with that file for its pid is respawned alone like a crashed one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

from torch.distributed import Store

from resiliency.launcher._agent_settings import AgentSettings
from resiliency.launcher._contracts import (
    INPROCESS_REJOIN_FILE_ENV,
    INPROCESS_UNABORTABLE_DIR_ENV,
    INPROCESS_UNABORTABLE_FILE,
)
from resiliency.launcher._cycle import Cycle
from resiliency.launcher._inprocess_store import InprocessStoreHost
from resiliency.launcher._monitors import MonitorSet
from resiliency.launcher._startup_watch import StartupWatch
from resiliency.launcher._torch_compat import CompatAgent
from resiliency.launcher._worker_groups import WorkerProcessGroups
from resiliency.launcher.fork_server import ForkServer

__all__ = ["Respawner", "unabortable_reason"]

logger = logging.getLogger(__name__)


# Deaths a respawn answers: a kill from outside (the OOM killer's SIGKILL) and a crash. SIGTERM
# and SIGINT ask a process to stop (the scheduler, the user): the group handles those the
# ordinary way, unless the Wrapper left its unabortable file for the dead pid.
_RESPAWNED = {
    int(sig)
    for sig in (
        signal.SIGKILL,
        signal.SIGSEGV,
        signal.SIGBUS,
        signal.SIGABRT,
        signal.SIGILL,
        signal.SIGFPE,
    )
}


@dataclass
class _Pending:
    """A respawned worker that has not joined yet."""

    rank: int | None
    pid: int
    marker: Path
    started: float
    deadline: float


def unabortable_reason(directory: Path, pid: int) -> str | None:
    """The reason a Wrapper left in ``directory`` for ``pid`` before it terminated its rank,
    which it could not abort in-process; None when it left none. The file is consumed.

    Args:
        directory: the workers' ``INPROCESS_UNABORTABLE_DIR_ENV``.
        pid: the dead worker's pid.
    """
    path = directory / INPROCESS_UNABORTABLE_FILE.format(pid=pid)
    try:
        reason = path.read_text()
    except FileNotFoundError:
        return None
    except OSError as exc:
        logger.error("cannot read %s (%s): the worker is not respawned alone", path, exc)
        return None
    with contextlib.suppress(OSError):
        path.unlink()
    return reason


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class Respawner:
    """Respawn dead workers alone and watch them join (see the module docstring).

    Args:
        enabled: ``--ft-inprocess-respawn``.
        timeout: ``--ft-respawn-timeout`` seconds.
        monitors: the node's rank monitors (each is told its worker's new pid).
        worker_groups: the workers' process groups the launcher ends at a stop.
        startup: whether new workers get the startup timer.
        fork_server: the ``--ft-preimport`` server, if any.
    """

    def __init__(
        self,
        *,
        enabled: bool,
        timeout: float,
        monitors: MonitorSet,
        worker_groups: WorkerProcessGroups,
        startup: StartupWatch,
        fork_server: ForkServer | None,
    ) -> None:
        self.enabled = enabled
        self.timeout = timeout
        self._monitors = monitors
        self._worker_groups = worker_groups
        self._startup = startup
        self._fork_server = fork_server
        self._cycle: Cycle | None = None
        self._pending: dict[int, _Pending] = {}
        self._fell_back = False
        self.respawns = 0
        # The Wrapper's store outlives every rank (rank 0 too) when this launcher hosts it.
        self._store_host = InprocessStoreHost(timedelta(seconds=max(timeout, 300.0)))

    @classmethod
    def of(
        cls,
        settings: AgentSettings,
        monitors: MonitorSet,
        worker_groups: WorkerProcessGroups,
        startup: StartupWatch,
    ) -> Respawner:
        """The respawner of an agent with these settings (a no-op when the flag is off)."""
        return cls(
            enabled=settings.inprocess_respawn,
            timeout=settings.respawn_timeout,
            monitors=monitors,
            worker_groups=worker_groups,
            startup=startup,
            fork_server=settings.fork_server,
        )

    def look(self, agent: CompatAgent, cycle: Cycle) -> int:
        """One look before torch's: respawn what died, follow what was respawned.

        Returns:
            The respawns charged in this look (each one also taken from the agent's
            remaining restarts).
        """
        if not self.enabled:
            return 0
        if cycle is not self._cycle:  # the group was (re)started: nothing pending any more
            self._cycle, self._fell_back = cycle, False
            self._pending.clear()
        self._follow(agent, cycle)
        if self._fell_back:
            return 0
        codes = agent.worker_returncodes()
        if not any(code is None for code in codes.values()):
            return 0  # nobody left running: torch's way
        dead = {
            lr: code
            for lr, code in codes.items()
            if code is not None
            and lr not in cycle.diagnosis.hangs
            and (self._unabortable(cycle.pids.get(lr), code) or -code in _RESPAWNED)
        }
        charged = 0
        for local_rank, code in sorted(dead.items()):
            if agent.remaining_restarts <= 0:
                logger.error(
                    "rank %s (local rank %d) died (%s) and no restarts are left "
                    "(--max-restarts): not respawning it; the worker group fails",
                    cycle.ranks.get(local_rank),
                    local_rank,
                    _signal_name(code),
                )
                return charged
            if self._respawn(agent, cycle, local_rank, code):
                charged += 1
        return charged

    def next_round(self, round_store: Store, group_rank: int, master_addr: str) -> None:
        """Host (node 0) or find this round's Wrapper store; nothing when the flag is off."""
        if self.enabled:
            self._store_host.next_round(round_store, group_rank, master_addr)

    def worker_env(self) -> dict[str, str]:
        """What every worker gets: where its Wrapper asks for a respawn and the port of the
        Wrapper's store (empty when off)."""
        if not self.enabled:
            return {}
        return {
            INPROCESS_UNABORTABLE_DIR_ENV: str(self._monitors.directory),
            **self._store_host.worker_env(),
        }

    def _unabortable(self, pid: int | None, code: int) -> bool:
        """Whether a worker that died of SIGTERM (or of the SIGKILL after its grace time) was
        terminated by its own Wrapper, which could not abort it in-process."""
        if pid is None or -code not in (signal.SIGTERM, signal.SIGKILL):
            return False
        reason = unabortable_reason(Path(self._monitors.directory), pid)
        if reason is None:
            return False  # a SIGTERM from someone else: asked to stop
        logger.warning("pid %d was terminated by its Wrapper: %s", pid, reason)
        return True

    def _respawn(self, agent: CompatAgent, cycle: Cycle, local_rank: int, code: int) -> bool:
        rank = cycle.ranks.get(local_rank)
        old_pid = cycle.pids.get(local_rank)
        marker = Path(self._monitors.directory) / f"rejoined-{local_rank}-{self.respawns}"
        factory = self._fork_server.make_handler if self._fork_server is not None else None
        started = time.monotonic()
        pid = agent.respawn_worker(local_rank, {INPROCESS_REJOIN_FILE_ENV: str(marker)}, factory)
        if pid is None:
            logger.error(
                "--ft-inprocess-respawn: this worker kind (a function entrypoint, --run-path) "
                "cannot be respawned alone; the worker group restarts as usual"
            )
            self._fell_back = True
            return False
        self.respawns += 1
        agent.remaining_restarts -= 1
        spec = agent.worker_group.spec
        restart = spec.max_restarts - agent.remaining_restarts
        cycle.pids[local_rank] = pid
        self._worker_groups.add(pid)
        self._monitors.worker_started(
            local_rank, pid, rank, restart, watch_startup=self._startup.watch_startup
        )
        self._pending[local_rank] = _Pending(rank, pid, marker, started, started + self.timeout)
        logger.warning(
            "rank %s (local rank %d, pid %s) died (%s); respawned it alone as pid %d in %.3f s "
            "(--ft-inprocess-respawn); the other workers keep running; %d of %d restarts left",
            rank,
            local_rank,
            old_pid,
            _signal_name(code),
            pid,
            time.monotonic() - started,
            agent.remaining_restarts,
            spec.max_restarts,
        )
        return True

    def _follow(self, agent: CompatAgent, cycle: Cycle) -> None:
        """Note the respawned workers that joined; fall back for those past the deadline."""
        codes = agent.worker_returncodes()
        for local_rank, pending in list(self._pending.items()):
            if pending.marker.exists():
                del self._pending[local_rank]
                with contextlib.suppress(OSError):
                    pending.marker.unlink()
                logger.info(
                    "rank %s, respawned as pid %d, joined the running job %.2f s after its respawn",
                    pending.rank,
                    pending.pid,
                    time.monotonic() - pending.started,
                )
            elif codes.get(local_rank) is not None:
                del self._pending[local_rank]  # it ended: judged like any worker
            elif time.monotonic() > pending.deadline:
                del self._pending[local_rank]
                self._fell_back = True
                cause = (
                    f"rank {pending.rank}, respawned as pid {pending.pid}, did not join the "
                    f"running job within {self.timeout:g} s (--ft-respawn-timeout)"
                )
                cycle.causes.insert(0, cause)
                logger.error("%s; killing it and restarting the whole worker group", cause)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pending.pid, signal.SIGKILL)  # its own session (as torch's)
