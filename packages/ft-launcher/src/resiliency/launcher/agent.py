"""FtElasticAgent: torch's local elastic agent plus rank monitors, restart policies and workload
control.

Torch does the rendezvous, the rank assignment and the worker processes; this agent adds, per
local rank, a rank monitor told about every new worker, and replaces torch's supervision loop with
one that also acts on monitor events (hangs, workload-control requests, dead monitors), asks a
restart policy what to do, and shares failures and shutdown requests with the other nodes through
the round's store.
"""

from __future__ import annotations

import logging
import signal
from typing import Any, cast

from torch.distributed import Store
from torch.distributed.elastic.agent.server.api import RunResult, WorkerGroup, WorkerState
from torch.distributed.elastic.multiprocessing import SignalException

from resiliency.ft import MonitorEvent
from resiliency.launcher._agent_settings import AgentSettings, Outcome
from resiliency.launcher._coordination import exit_barrier, failed_elsewhere, stand_by
from resiliency.launcher._cycle import Cycle
from resiliency.launcher._diagnosis import HangDiagnosis, culprit_cause
from resiliency.launcher._event_pump import EventPump
from resiliency.launcher._exchange_store import exchange_store_for
from resiliency.launcher._failure_diagnosis import diagnose_cycle, diagnose_node_end, stop_rules_for
from resiliency.launcher._goodput_events import GoodputEvents
from resiliency.launcher._health_watch import HealthWatch
from resiliency.launcher._job_verdict import EVIDENCE_SLACK_S, JobHangExchange
from resiliency.launcher._loop_state import (
    LoopState,
    group_state,
    loop_state,
    policy_state,
    result_for_torch,
)
from resiliency.launcher._monitors import MONITOR_SOCKET_ENV, MonitorSet
from resiliency.launcher._node_handle import NodeHandle, stopped_result
from resiliency.launcher._node_leaves import LEFT_ON_ITS_OWN, NodeLeaves, unhealthy
from resiliency.launcher._preemption import (
    env_for,
    is_preempted,
    launcher_stopping,
    mark_stop_after_a_failure,
    new_attempt,
)
from resiliency.launcher._respawn import Respawner
from resiliency.launcher._round_watch import RoundWatcher
from resiliency.launcher._shared_state import SharedRoundState
from resiliency.launcher._startup_watch import StartupWatch
from resiliency.launcher._store_host_lost import nodes_waiting
from resiliency.launcher._supervision import NodeView, Supervision, SupervisorRequest
from resiliency.launcher._torch_compat import CompatAgent, worker_handler_factory
from resiliency.launcher._worker_exit import sleep_until_an_exit
from resiliency.launcher._worker_groups import WorkerProcessGroups
from resiliency.launcher._workload_control import (
    exclude_this_node,
    follow_shutdown,
    shutdown_workload,
)
from resiliency.launcher.exit_codes import ExitCode
from resiliency.launcher.health import run_health_checks
from resiliency.launcher.options import FINISHED_FLAG_ENV
from resiliency.launcher.policy import Decision, GroupObservation, LocalState
from resiliency.launcher.verdict import HangVerdict

__all__ = ["AgentSettings", "FtElasticAgent", "Outcome"]

logger = logging.getLogger(__name__)


class FtElasticAgent(CompatAgent):
    """A ``LocalElasticAgent`` that restarts hung and failed workers in place.

    Args:
        spec: torch's worker spec (its rendezvous handler should be a
            :class:`~resiliency.launcher.rendezvous.FreshStoreRendezvousHandler`).
        logs_specs: torch's log destinations.
        monitors: this node's rank monitors.
        settings: fault-tolerance settings.
        **agent_kwargs: passed to ``LocalElasticAgent`` (start_method, shutdown_timeout, ...).
    """

    def __init__(
        self,
        spec: Any,
        logs_specs: Any,
        *,
        monitors: MonitorSet,
        settings: AgentSettings,
        **agent_kwargs: Any,
    ) -> None:
        super().__init__(spec, logs_specs, **agent_kwargs)
        self._monitors = monitors
        self._settings = settings
        self.stop_rules = stop_rules_for(settings.ft_cfg)  # the diagnosis' decisions (issue 28)
        self._cycle = self._new_cycle()
        self._startup = StartupWatch(monitors, settings.ft_cfg.rank_startup_timeout)
        self._events = EventPump(monitors, self._startup, settings.ft_cfg, self._cycle)
        self._shared: SharedRoundState | None = None
        self._watcher: RoundWatcher | None = None
        self._job: JobHangExchange | None = None  # a round of several nodes only
        self._published_failure = False
        self._worker_groups = WorkerProcessGroups()
        self._respawner = Respawner.of(settings, monitors, self._worker_groups, self._startup)
        self.outcome: Outcome | None = None
        self.restarts_done = 0
        self.verdicts: list[str] = []
        self.diagnoses: list[dict[str, Any]] = []  # every failure's verdict and decision
        self.attempt_causes: list[str] = []
        self._health: HealthWatch | None = None
        self.supervision: Supervision | None = None  # --supervisor / --status-port

    @property
    def goodput(self) -> GoodputEvents:
        """Where the job's goodput events go (launch() sets the recording one: --goodput-dir)."""
        return self._events.goodput

    @goodput.setter
    def goodput(self, events: GoodputEvents) -> None:
        self._events.goodput = events

    @property
    def hangs_detected(self) -> int:
        """Hangs the monitors reported since the launcher started."""
        return self._events.hangs_detected

    @property
    def round_state(self) -> SharedRoundState | None:
        """The current rendezvous round's shared state (None before the first rendezvous)."""
        return self._shared

    def _new_cycle(self) -> Cycle:
        cfg = self._settings.ft_cfg
        return Cycle(
            HangDiagnosis(self._monitors, cfg.stack_dump_timeout, cfg.termination_grace_period)
        )

    # --- worker environment and lifecycle hooks ------------------------------------------------
    def extra_worker_env(self, local_rank: int) -> dict[str, str]:
        """Hand each worker its monitor's socket and the finished-flag path."""
        env = {MONITOR_SOCKET_ENV: self._monitors.socket_path(local_rank)}
        if self._settings.finished_flag_file:
            env[FINISHED_FLAG_ENV] = self._settings.finished_flag_file
        env.update(env_for(self._settings.preemption))
        env.update(self._respawner.worker_env())  # --ft-inprocess-respawn
        return env

    def before_rendezvous(self) -> None:
        """Run the node health checks; an unhealthy node does not (re)join: `NodeLeaves`."""
        failed = [r for r in run_health_checks(self._settings.health_checks) if not r.healthy]
        if failed:
            raise unhealthy(failed)

    def after_rendezvous(self, worker_group: WorkerGroup) -> None:
        """Bind the shared round state to the new round's store and start following it."""
        self._stop_watching()
        # torch leaves WorkerGroup.store untyped (None until the first rendezvous).
        store, rank = cast(Store, worker_group.store), worker_group.group_rank or 0
        backend = self.supervision.exchange_backend() if self.supervision is not None else None
        self._shared = SharedRoundState(
            store,
            world=worker_group.group_world_size or 1,
            rank=rank,
            exchange=exchange_store_for(store, rank, backend),
        )
        self._watcher = RoundWatcher(self._shared).start()
        self._respawner.next_round(store, rank, worker_group.master_addr or "127.0.0.1")
        self._published_failure = False
        self._job = None
        if self._shared.world > 1 and self._settings.ft_cfg.enable_stack_dump:
            wait_s = self._settings.ft_cfg.stack_dump_timeout + EVIDENCE_SLACK_S
            self._job = JobHangExchange(self._shared, wait_s + worker_group.spec.monitor_interval)
        self._events.job = self._job

    def _stop_watching(self) -> None:
        if self._watcher is not None:
            self._watcher.stop()
            self._watcher = None

    def _start_workers(self, worker_group: WorkerGroup) -> dict[int, Any]:
        self._monitors.start_all()
        new_attempt(self._settings.preemption)
        launcher_stopping(self._settings.preemption, False)
        pids: dict[int, Any]
        if self._settings.fork_server is None:
            pids = super()._start_workers(worker_group)
        else:
            with worker_handler_factory(self._settings.fork_server.make_handler):
                pids = super()._start_workers(worker_group)
        restart = worker_group.spec.max_restarts - self.remaining_restarts
        self._cycle = self._events.cycle = self._new_cycle()
        self.bound_worker_close(self._settings.workers_stop_timeout, self._cycle.note_signalled)
        self.goodput.cycle_started(node=str(worker_group.group_rank))
        for local_rank, pid in pids.items():
            rank = worker_group.workers[local_rank].global_rank
            self._worker_groups.add(int(pid))
            self._cycle.pids[local_rank] = int(pid)
            self._cycle.ranks[local_rank] = rank
            self._monitors.worker_started(
                local_rank, int(pid), rank, restart, watch_startup=self._startup.watch_startup
            )
        self._startup.cycle_started(self._cycle.ranks)
        logger.info(
            "workers started (attempt %d): %s",
            restart,
            ", ".join(f"rank {self._cycle.ranks[lr]} pid {p}" for lr, p in sorted(pids.items())),
        )
        return pids

    def request_shutdown(self) -> None:
        """Stop this node's workers now, as the launcher's own stop (not a preemption: the
        workers' emergency handler saves nothing), and return once they are gone.

        A hung rank is left to its monitor's escalation first; the other ranks get SIGTERM,
        then SIGKILL after ``--workers-stop-timeout``; the caller decides how the job goes on.
        """
        self._stop_workers(self.worker_group)

    def _node(self) -> NodeHandle:
        """This node as the loop's helpers act on it (the current round's shared state)."""
        return NodeHandle(self.worker_group, self._shared, self.request_shutdown)

    def _end(self, outcome: Outcome) -> RunResult:
        """Record how the job ended on this node; its workers were stopped on purpose."""
        self.outcome = outcome
        return stopped_result(self.worker_group)

    def _stop_workers(self, worker_group: WorkerGroup, is_restart: bool = False) -> None:
        # A stop of our own (restart, failure), not a preemption: no emergency save.
        launcher_stopping(self._settings.preemption, True)
        self._shutdown(timeout=self._settings.workers_stop_timeout, is_restart=is_restart)

    def _shutdown(
        self,
        death_sig: signal.Signals = signal.SIGTERM,
        timeout: float = 30,
        is_restart: bool = False,
    ) -> None:
        # A hung rank is its monitor's to end (grace period, then SIGKILL): let it finish first.
        for lr in self._cycle.diagnosis.await_ends(self._events.pump):
            logger.warning("the monitor of local rank %d did not report its hung rank gone", lr)
        self._monitors.workers_stopped()
        self.shutdown_workers(death_sig, timeout=timeout, is_restart=is_restart)
        self._worker_groups.end_leftovers()

    # --- monitoring ---------------------------------------------------------------------------
    def _look(self, worker_group: WorkerGroup) -> tuple[RunResult, LoopState]:
        """One look at the workers: torch's result, then every monitor event, then the state."""
        mark_stop_after_a_failure(self._settings.preemption, self.worker_returncodes)
        self.restarts_done += self._respawner.look(self, self._cycle)  # --ft-inprocess-respawn
        result: RunResult = super()._monitor_workers(worker_group)
        # After torch's look: a rank its monitor killed as hung has its hang event queued
        # already, so its failure is not blamed on the monitor's signal.
        self._events.pump()  # the agent reads monitor events here only (waits are handed the pump)
        self._startup.check()
        if result.state == WorkerState.FAILED:
            self._cycle.note_failures(result.failures)
        dead = self._monitors.dead_monitors()
        for local_rank in dead:
            cause = (
                f"rank monitor of local rank {local_rank} (rank "
                f"{self._cycle.ranks.get(local_rank)}) died; its worker is no longer watched"
            )
            logger.error("%s: starting a new monitor and failing the worker group", cause)
            self._cycle.monitor_died(local_rank, cause)
            self._monitors.replace(local_rank)
        hung = bool(self._cycle.diagnosis.hangs)
        return result, loop_state(result, hung=hung, monitor_died=bool(dead))

    def _for_torch(self, result: RunResult, state: LoopState) -> RunResult:
        signum = int(self._settings.ft_cfg.rank_termination_signal)
        return result_for_torch(result, state, self._cycle.diagnosis.hangs, signum)

    def _collect_verdict(self) -> bool:
        """Log this node's hang verdict; True when it published evidence for the job's."""
        cycle = self._cycle
        verdict = cycle.diagnosis.verdict(cycle.ranks, self._events.pump)
        if verdict is not None:
            self._blame(verdict)
        if self._job is None:
            return False
        restart = self.worker_group.spec.max_restarts - self.remaining_restarts
        return self._job.contribute(cycle, self._events.pump, local=verdict, restart=restart)

    def _blame(self, verdict: HangVerdict) -> None:
        self.verdicts.append(verdict.summary)
        self._cycle.hang_verdict = verdict  # the job-wide one replaces the node's
        logger.error("%s", verdict.summary)
        cause = culprit_cause(verdict, self._cycle.ranks, self._cycle.pids)
        if cause is not None:
            self._cycle.causes.insert(0, cause)  # the root cause is the culprit, not a timer

    # --- the supervision loop -----------------------------------------------------------------
    def supervise(self, role: str) -> RunResult:
        """Start the workers and supervise them until the job ends on this node.

        Returns:
            torch's ``RunResult`` of the last attempt; :attr:`outcome` tells how the job ended.
        """
        checks = self._settings.health_checks
        if checks:  # while the workers run: in the background, read by the loop
            self._health = HealthWatch(checks, self._settings.ft_cfg.node_health_check_interval)
            self._health.start()
        try:
            return self._supervise()
        except SignalException as got:  # the scheduler's SIGTERM: this node is preempted
            self._diagnose_end(signal_name=got.sigval.name)
            raise
        except NodeLeaves as leave:
            self.outcome = leave.outcome
            logger.error("this node leaves the job: %s", leave.outcome.detail)
            self._diagnose_end(health=leave.health, lost=leave.lost)
            if self._shared is not None and leave.lost is None:  # None: the store is there
                self._shared.publish_left()
            self.request_shutdown()
            return stopped_result(self.worker_group)
        finally:
            if self._health is not None:
                self._health.stop()
            self._stop_watching()

    def _supervise(self) -> RunResult:  # noqa: PLR0911 - one return per way the job ends
        group = self.worker_group
        spec = group.spec
        self.initialize_workers()
        while True:
            sleep_until_an_exit(self._cycle, spec.monitor_interval, self._settings.fork_server)
            result, state = self._look(group)
            if self.supervision is not None and (asked := self.supervision.take_request()):
                result, state = self._follow_supervisor(asked, result, state)
            group.state = group_state(state)
            preemption = self._settings.preemption
            if state.failed and (preempted := is_preempted(preemption, self.worker_returncodes)):
                self.outcome = Outcome(ExitCode.PREEMPTED, "preempted", preempted)
                return self._for_torch(result, state)
            # The round watcher's latest state: no store operation per monitoring interval.
            shared = self._watcher.snapshot() if self._watcher is not None else None

            if self._cycle.shutdown is not None:
                return self._end(shutdown_workload(self._node(), self._cycle.shutdown))
            if shared is not None and shared.shutdown is not None:
                return self._end(follow_shutdown(self._node(), shared.shutdown))
            if self._cycle.exclude is not None:
                return self._end(exclude_this_node(self._node(), self._cycle.exclude))
            if self._health is not None and (failed := self._health.failures()):
                # While workers run, a node that turns unhealthy leaves like ExcludeThisNode.
                raise unhealthy(failed)

            local = policy_state(state)  # a hang is a failed node to the policy
            obs = GroupObservation(
                local=local,
                nodes_in_group=group.group_world_size or 1,
                failed_nodes=failed_elsewhere(shared, self._published_failure),
                nodes_waiting=nodes_waiting(group),
                min_nodes=self._settings.min_nodes,
                remaining_restarts=self.remaining_restarts,
            )
            decision = self._settings.policy.decide(obs)
            if decision is Decision.CONTINUE:
                continue
            if decision is Decision.FINISH:
                self.exit_barrier()
                self.outcome = Outcome(ExitCode.SUCCESS, "succeeded", "all workers exited 0")
                return result
            if (stop := self._end_cycle(local, result, decision is Decision.GIVE_UP)) is not None:
                return stop  # the diagnosis stopped the job, or this node leaves it
            if decision is Decision.RESTART:
                self.remaining_restarts -= 1
                self.restarts_done += 1
                logger.warning(
                    "restarting the worker group (%s); %d of %d restarts left",
                    self._cycle_summary(),
                    self.remaining_restarts,
                    spec.max_restarts,
                )
                self.restart_workers()
            elif decision is Decision.REFORM:
                logger.warning(
                    "re-forming the worker group: %s",
                    f"{obs.failed_nodes} node(s) failed" if obs.failed_nodes else "nodes joined",
                )
                self.restart_workers()
            elif decision is Decision.STANDBY:
                if (ended := self._stand_by()) is not None:
                    self.outcome = ended
                    # With no restarts left the failure is torch's to report, as for GIVE_UP.
                    exhausted = ended.exit_code == ExitCode.FAILURE
                    return self._for_torch(result, state) if exhausted else stopped_result(group)
            else:  # GIVE_UP
                self.request_shutdown()
                group.state = WorkerState.FAILED
                root = self.attempt_causes[0] if self.attempt_causes else "unknown"
                last = self.attempt_causes[-1] if self.attempt_causes else "unknown"
                self.outcome = Outcome(
                    ExitCode.FAILURE,
                    "restarts_exhausted",
                    f"root cause: {root}; no restarts left ({spec.max_restarts} allowed)"
                    + (f"; last failure: {last}" if last != root else ""),
                )
                return self._for_torch(result, state)

    def _diagnose_end(self, **why: Any) -> None:
        """Record why the job ends here outside a failed cycle (:func:`diagnose_node_end`)."""
        attempt = self.worker_group.spec.max_restarts - self.remaining_restarts
        if record := diagnose_node_end(self._node(), self._cycle, attempt, self.goodput, **why):
            self.diagnoses.append(record)

    def _stand_by(self) -> Outcome | None:
        """Min-healthy standby; on rejoining, charge one restart and start the workers."""
        if self._watcher is None:
            raise RuntimeError("standby without a rendezvous round")
        ended = stand_by(
            self._node(),
            self._watcher,
            min_nodes=self._settings.min_nodes,
            remaining_restarts=self.remaining_restarts,
            causes=self.attempt_causes,
        )
        if ended is None:
            self.remaining_restarts -= 1
            self.restarts_done += 1
            self.initialize_workers()
        return ended

    def _follow_supervisor(
        self, request: SupervisorRequest, result: RunResult, state: LoopState
    ) -> tuple[RunResult, LoopState]:
        """Carry out an intent of the job's supervisor (``--supervisor``)."""
        if request.action == "exclude":
            raise NodeLeaves(Outcome(ExitCode.NODE_EXCLUDED, "node_excluded", request.detail))
        if request.action == "shutdown":
            self._cycle.shutdown = MonitorEvent(
                kind="wlc", action="ShutdownWorkload", desc=request.detail
            )
            return result, state
        logger.warning(
            "%s: restarting the workers (a new rendezvous round, not charged)", request.detail
        )
        self.restart_workers()
        return RunResult(state=WorkerState.HEALTHY), LoopState.RUNNING

    def node_view(self) -> NodeView:
        """What this node's supervision sensor publishes (read on the sensor's thread)."""
        return NodeView(
            outcome_reason=self.outcome.reason if self.outcome is not None else None,
            worker_state=self.worker_group.state,
            group_rank=self.worker_group.group_rank,
            ranks=dict(self._cycle.ranks),
            attempt_causes=list(self.attempt_causes),
            restarts=self.restarts_done,
        )

    def _cycle_summary(self) -> str:
        return self._cycle.causes[0] if self._cycle.causes else "another node failed"

    def _end_cycle(self, local: LocalState, result: RunResult, give_up: bool) -> RunResult | None:
        """Close the books on this attempt: verdicts, root cause, tell the other nodes, and
        diagnose it (:func:`diagnose_cycle`: its result when the diagnosis ends the job here)."""
        contributed = self._collect_verdict()
        self.goodput.cycle_ended()
        if local is LocalState.FAILED and self._shared is not None and not self._published_failure:
            # Before the job-wide wait: a node with no hang of its own contributes on seeing it.
            self._published_failure = True
            try:
                self._shared.publish_failed()
            except RuntimeError as exc:  # the round's store went with its host (node 0)
                logger.error("cannot tell the other nodes this node failed: %s", exc)
        if contributed and self._job is not None:
            self._blame(self._job.judge())
        if local is LocalState.FAILED:
            self.attempt_causes.append(self._cycle_summary())
        group = self.worker_group
        health = self._health.failures() if self._health is not None else []
        diagnosed = diagnose_cycle(
            self._node(),
            self._cycle,
            attempt=group.spec.max_restarts - self.remaining_restarts,
            failures=result.failures,
            health=tuple(f"{h.name}: {h.detail}" for h in health),
            rules=self.stop_rules,
            goodput=self.goodput,
            give_up=give_up,
        )
        if diagnosed is None:
            return None
        self.diagnoses.append(diagnosed.record)
        return self._end(diagnosed.outcome) if diagnosed.outcome is not None else None

    # --- exit barrier ---------------------------------------------------------------------------
    def exit_barrier(self) -> None:
        """Wait until every node of the round finished or stepped aside, then release standbys."""
        if self._shared is not None:
            exit_barrier(self._shared, self.exit_barrier_timeout)

    def leaves_rendezvous_open(self) -> bool:
        """True when this node left on its own and must not close the rendezvous for the rest."""
        return self.outcome is not None and self.outcome.reason in LEFT_ON_ITS_OWN
