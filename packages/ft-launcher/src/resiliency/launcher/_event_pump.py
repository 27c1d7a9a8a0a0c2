"""The one reader of this node's monitor events: it applies each to the current cycle.

The agent's loop pumps once per look at the workers; a helper that waits for monitor answers (the
hang diagnosis waiting for stack dumps or for a hung rank's end, the job-wide hang exchange) is
handed :meth:`EventPump.pump` and drives the same pump while it waits. Every event therefore goes
through one place, whoever happens to be waiting, and nothing here calls back into the agent.
"""

from __future__ import annotations

import logging

from resiliency.ft import FaultToleranceConfig, MonitorEvent, WorkloadAction
from resiliency.launcher._cycle import Cycle
from resiliency.launcher._goodput_events import GoodputEvents
from resiliency.launcher._job_verdict import JobHangExchange
from resiliency.launcher._monitors import MonitorSet
from resiliency.launcher._startup_watch import StartupWatch

__all__ = ["EventPump"]

logger = logging.getLogger(__name__)


class EventPump:
    """Reads the monitors' events and records them in the current :class:`Cycle`.

    Args:
        monitors: this node's rank monitors.
        startup: the startup watch (told which ranks connected).
        ft_cfg: the monitors' configuration (termination signal, grace period, stack dumps).
        cycle: the cycle the events belong to; the agent sets a new one per attempt.

    Attributes:
        cycle: the current cycle.
        job: the job-wide hang exchange of the current round (several nodes only).
        goodput: where hang events are recorded.
        hangs_detected: hangs reported by the monitors since the launcher started.
    """

    def __init__(
        self,
        monitors: MonitorSet,
        startup: StartupWatch,
        ft_cfg: FaultToleranceConfig,
        cycle: Cycle,
    ) -> None:
        self._monitors = monitors
        self._startup = startup
        self._cfg = ft_cfg
        self.cycle = cycle
        self.job: JobHangExchange | None = None
        self.goodput = GoodputEvents(None)
        self.hangs_detected = 0

    def pump(self) -> None:
        """Read every pending monitor event and apply it to the current cycle."""
        for event in self._monitors.poll_events():
            self._apply(event)

    def _apply(self, event: MonitorEvent) -> None:
        local_rank = event.local_rank
        cycle = self.cycle
        if local_rank is None:
            logger.warning("monitor event without a local rank ignored: %s", event.raw)
        elif event.kind == "hang":
            self._on_hang(local_rank, event)
        elif event.kind == "killed":
            cycle.diagnosis.add_ended(local_rank, event)
        elif event.kind == "stacks":
            cycle.diagnosis.add_stacks(local_rank, event.stack_dump)
        elif event.kind == "wlc":
            self._on_workload_control(event)
        elif event.kind == "rank_connected":
            cycle.connected.add(local_rank)
            self._startup.connected(local_rank)
        elif event.kind == "rank_disconnected":
            cycle.connected.discard(local_rank)
        else:
            logger.debug("monitor event: %s", event)

    def _on_hang(self, local_rank: int, event: MonitorEvent) -> None:
        cycle = self.cycle
        if local_rank in cycle.diagnosis.hangs:
            return
        if cycle.pids.get(local_rank) not in (None, event.pid):
            logger.info("ignoring a hang report about an earlier worker (pid %s)", event.pid)
            return
        elapsed = f"{event.elapsed:.1f} s" if event.elapsed is not None else "?"
        limit = f"{event.limit:.1f} s" if event.limit is not None else "?"
        cause = (
            f"rank {event.rank} (local rank {local_rank}, pid {event.pid}) hung: "
            f"{event.timer} timer expired after {elapsed} (limit {limit})"
        )
        cfg = self._cfg
        logger.error(
            "%s; its monitor stops it (%s, SIGKILL after %g s)",
            *(cause, cfg.rank_termination_signal.name, cfg.termination_grace_period),
        )
        self.hangs_detected += 1
        self.goodput.hang_detected(event.rank, event.timer, event.elapsed, event.limit)
        cycle.causes.append(cause)
        first = cycle.diagnosis.add_hang(local_rank, event)
        if first and self.job is not None:
            self.job.announce()  # the other nodes contribute their ranks' stacks
        if first and cfg.enable_stack_dump:
            # The other local ranks are about to be stopped: collect their stacks first.
            peers = [lr for lr in cycle.pids if lr != local_rank and lr in cycle.connected]
            cycle.diagnosis.request_peer_stacks(peers)

    def _on_workload_control(self, event: MonitorEvent) -> None:
        try:
            action = WorkloadAction(event.action)
        except ValueError:
            logger.error("rank %s sent an unknown workload action %r", event.rank, event.action)
            return
        logger.warning(
            "rank %s requested %s: %s", event.rank, action.value, event.desc or "(no reason given)"
        )
        if action is WorkloadAction.ShutdownWorkload:
            self.cycle.shutdown = event
        else:
            self.cycle.exclude = event
