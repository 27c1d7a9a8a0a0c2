"""Turn parsed ``ft-launcher`` arguments into a running job and an exit code."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import uuid
from types import FrameType
from typing import Any

from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError, get_error_handler
from torch.distributed.elastic.rendezvous import RendezvousClosedError
from torch.distributed.run import config_from_args as torchrun_config_from_args
from torch.distributed.run import parse_min_max_nnodes

from resiliency.ft import FaultToleranceConfig
from resiliency.launcher._goodput_events import GoodputEvents
from resiliency.launcher._monitors import MonitorSet
from resiliency.launcher._preemption import Preemption, clean_up, is_preempted
from resiliency.launcher._supervision import Supervision, start_supervision
from resiliency.launcher._torch_compat import run_launch_agent
from resiliency.launcher.agent import AgentSettings, FtElasticAgent, Outcome
from resiliency.launcher.errors import ForkServerError
from resiliency.launcher.exit_codes import ExitCode
from resiliency.launcher.fork_server import ForkServer
from resiliency.launcher.health import (
    CallableHealthCheck,
    CommandHealthCheck,
    HealthCheck,
    NvmlGpuHealthCheck,
)
from resiliency.launcher.options import LauncherOptions
from resiliency.launcher.policy import policy_from_name
from resiliency.launcher.rendezvous import FreshStoreRendezvousHandler

__all__ = ["build_health_checks", "launch"]

logger = logging.getLogger(__name__)

_HANDLED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")
#: torch's variable for the launcher's own error file (``@record`` copies the root cause there).
_ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"


def build_health_checks(options: LauncherOptions) -> tuple[HealthCheck, ...]:
    """Return the node health checks the options ask for.

    Args:
        options: the launcher options.

    Returns:
        The checks, in the order they run.

    Raises:
        HealthCheckError: a check cannot be set up (unknown callable, empty command).
    """
    checks: list[HealthCheck] = []
    if options.gpu_health_check:
        checks.append(NvmlGpuHealthCheck())
    if options.node_health_check_cmd:
        checks.append(CommandHealthCheck(options.node_health_check_cmd))
    if options.node_health_check_fn:
        checks.append(CallableHealthCheck(options.node_health_check_fn))
    return tuple(checks)


def _raise_signal_exception(signum: int, frame: FrameType | None) -> None:
    raise SignalException(f"ft-launcher got signal {signum}", sigval=signal.Signals(signum))


def _ignore_further_signals(signum: int, frame: FrameType | None) -> None:
    logger.warning("got signal %d again while shutting down; still shutting down", signum)


def _install_signal_handlers(names: str, handler: object) -> None:
    for name in names.split(","):
        sig = getattr(signal, name.strip(), None)
        if sig is not None:
            signal.signal(sig, handler)  # type: ignore[arg-type]


def _prepare_rendezvous(args: argparse.Namespace) -> None:
    """Apply torchrun's rules for --standalone and for single-node runs without an endpoint."""
    single_node = parse_min_max_nnodes(args.nnodes)[1] == 1
    no_endpoint = args.rdzv_backend == "static" and not args.rdzv_endpoint
    if args.standalone or (no_endpoint and args.master_port is None and single_node):
        args.rdzv_backend = "c10d"
        args.rdzv_endpoint = "localhost:0"
        args.rdzv_id = str(uuid.uuid4())
    if args.master_port is None:
        args.master_port = 29500


def launch(
    args: argparse.Namespace,
    ft_cfg: FaultToleranceConfig,
    options: LauncherOptions,
    health_checks: tuple[HealthCheck, ...],
    fork_server: ForkServer | None = None,
) -> int:
    """Run the job on this node until it ends; return the launcher's exit code.

    Args:
        args: parsed arguments (torchrun's and the fault-tolerance group).
        ft_cfg: the rank monitors' configuration.
        options: the launcher's own options.
        health_checks: run before every (re)join of the rendezvous.
        fork_server: the ``--ft-preimport`` server, already started (launch waits until it
            is ready, and closes it at the end); None starts one when ``options`` asks.

    Returns:
        The exit code (see :mod:`resiliency.launcher.exit_codes`).
    """
    _install_signal_handlers(args.signals_to_handle, _raise_signal_exception)
    _prepare_rendezvous(args)
    goodput = GoodputEvents.from_args(args)  # --goodput-dir: job, cycle and hang events
    goodput.job_started()
    # Workers get a fresh store per round from FreshStoreRendezvousHandler; this also keeps the
    # dynamic rendezvous from starting a shared store server nobody uses.
    os.environ.setdefault("TORCH_DISABLE_SHARE_RDZV_TCP_STORE", "1")
    os.environ["TORCHELASTIC_SIGNALS_TO_HANDLE"] = args.signals_to_handle
    config, entrypoint, entry_args = torchrun_config_from_args(args)
    if options.term_timeout is not None:
        config.shutdown_timeout = options.term_timeout  # type: ignore[assignment]
    term_timeout = float(config.shutdown_timeout or 30)
    preemption = Preemption(term_timeout)
    try:
        monitors = MonitorSet(ft_cfg, config.nproc_per_node)
    except BaseException:
        clean_up(preemption)
        raise
    try:  # --ft-preimport: imports once, here, before the first rendezvous
        if fork_server is not None:
            fork_server.wait_ready()
        elif options.preimport:
            fork_server = ForkServer(list(options.preimport))
    except BaseException as exc:
        monitors.stop_all()
        clean_up(preemption)
        if not isinstance(exc, ForkServerError):
            raise
        logger.error("ft-launcher exits 1: %s", exc)
        goodput.job_ended(int(ExitCode.FAILURE), "fork_server_failed")
        return int(ExitCode.FAILURE)
    settings = AgentSettings(
        ft_cfg=ft_cfg,
        policy=policy_from_name(options.restart_policy),
        min_nodes=config.min_nodes,
        workers_stop_timeout=options.workers_stop_timeout,
        health_checks=health_checks,
        finished_flag_file=options.finished_flag_file,
        preemption=preemption,
        fork_server=fork_server,
        inprocess_respawn=options.inprocess_respawn,
        respawn_timeout=options.respawn_timeout,
    )
    built: list[FtElasticAgent] = []
    supervision: list[Supervision] = []

    def make_agent(*, spec: Any, logs_specs: Any, **agent_kwargs: Any) -> FtElasticAgent:
        """Called by torch's launch_agent where it would build its LocalElasticAgent."""
        handler = FreshStoreRendezvousHandler(spec.rdzv_handler, config.local_addr)
        spec.rdzv_handler = handler
        agent = FtElasticAgent(
            spec, logs_specs, monitors=monitors, settings=settings, **agent_kwargs
        )
        agent.goodput = goodput
        handler.keep_open = agent.leaves_rendezvous_open
        built.append(agent)
        if (started := start_supervision(args, agent.node_view, monitors)) is not None:
            agent.supervision = started  # --supervisor / --status-port: the loop takes its intents
            supervision.append(started)
        logger.info(
            "ft-launcher: %d worker(s) on this node, nnodes %d:%d, rendezvous %s at %s, "
            "restart policy %s, max restarts %d, monitor sockets in %s",
            config.nproc_per_node,
            config.min_nodes,
            config.max_nodes,
            config.rdzv_backend,
            config.rdzv_endpoint,
            options.restart_policy,
            config.max_restarts,
            monitors.directory,
        )
        return agent

    workers_failed: ChildFailedError | None = None
    try:
        # torch's own launcher path, as torchrun runs it: rendezvous, health-check server,
        # metrics, events, ChildFailedError for @record, and closing the rendezvous at the end.
        run_launch_agent(config, entrypoint, entry_args, make_agent)
        outcome = _outcome(built, None)
    except ChildFailedError as exc:
        workers_failed = exc
        outcome = _outcome(built, exc)
    except SignalException as exc:
        _install_signal_handlers(args.signals_to_handle, _ignore_further_signals)
        outcome = _outcome_after_signal(built, exc.sigval)
    except RendezvousClosedError:
        outcome = _outcome_without_verdict(built)
    except Exception as exc:
        # e.g. the store's host left first
        if built and is_preempted(preemption, built[0].worker_returncodes):
            logger.warning("after the workers' emergency checkpoint: %r", exc)
        else:
            logger.exception("ft-launcher failed")
        outcome = Outcome(ExitCode.FAILURE, "launcher_error", f"{type(exc).__name__}: {exc}")
    finally:
        _install_signal_handlers(args.signals_to_handle, _ignore_further_signals)
        for running in supervision:
            running.stop()
        monitors.stop_all()
        if fork_server is not None:
            fork_server.close()
    agent = built[0] if built else None
    if (
        agent is not None
        and outcome.exit_code != ExitCode.PREEMPTED
        and (detail := is_preempted(preemption, agent.worker_returncodes))
    ):
        outcome = Outcome(ExitCode.PREEMPTED, "preempted", detail)  # e.g. a forwarded SIGTERM
    if outcome.reason == "restarts_exhausted" and workers_failed is not None:
        _report_torch_failure(workers_failed)
    _report(agent, outcome, options.exit_status_file, preemption.status_fields())
    goodput.job_ended(int(outcome.exit_code), outcome.reason)
    clean_up(preemption)
    return int(outcome.exit_code)


def _report_torch_failure(failed: ChildFailedError) -> None:
    """What torchrun gives for failed workers, before the launcher's final line, never after.

    torchrun raises ``ChildFailedError`` through ``@record``: a Python traceback and torch's
    failure table after everything else, so the launcher's own verdict was no longer the last
    line. Here the table is logged (it names each failed rank's error file and traceback) and
    ``@record``'s one useful act is done directly: the root-cause worker's error file is copied
    to this launcher's ``TORCHELASTIC_ERROR_FILE`` when that is set.
    """
    logger.info("torch's failure report:\n%s", failed.format_msg().strip())
    _, failure = failed.get_first_failure()
    if not os.environ.get(_ERROR_FILE_ENV) or not os.path.isfile(failure.error_file):
        return
    try:
        get_error_handler().dump_error_file(failure.error_file, failure.exitcode)
    except (OSError, ValueError) as exc:
        logger.warning(
            "cannot copy the error file %s of rank %s to %s: %s",
            *(failure.error_file, failure.local_rank, os.environ[_ERROR_FILE_ENV], exc),
        )


def _outcome(built: list[FtElasticAgent], failed: ChildFailedError | None) -> Outcome:
    """How the run ended, from the agent's verdict (or torch's failure report without one)."""
    if built and built[0].outcome is not None:
        return built[0].outcome
    if failed is not None:
        return Outcome(ExitCode.FAILURE, "workers_failed", str(failed).strip().splitlines()[0])
    return _outcome_without_verdict(built)


def _outcome_without_verdict(built: list[FtElasticAgent]) -> Outcome:
    """The agent stopped without deciding (rendezvous closed by another node)."""
    shared = built[0].round_state if built else None
    if shared is not None:
        try:
            request = shared.read().shutdown
        except RuntimeError as exc:
            logger.debug("cannot read the last round's state: %s", exc)
            request = None
        if request is not None:
            return Outcome(
                ExitCode.SHUTDOWN_WORKLOAD,
                "shutdown_workload",
                f"rank {request.get('rank')} requested ShutdownWorkload: {request.get('desc')}",
            )
    return Outcome(ExitCode.FAILURE, "rendezvous_closed", "the rendezvous was closed")


def _outcome_after_signal(built: list[FtElasticAgent], sig: signal.Signals) -> Outcome:
    codes = built[0].worker_returncodes() if built else {}
    clean = bool(codes) and all(code == 0 for code in codes.values())
    detail = f"got {sig.name}; forwarded it to the workers; worker exit codes: " + (
        ", ".join(f"local rank {lr}: {c}" for lr, c in sorted(codes.items())) or "none started"
    )
    if clean:
        return Outcome(ExitCode.SUCCESS, "signal_clean", detail)
    # As NVIDIA's ft_launcher (and torchrun): a signal that did not end every worker cleanly is
    # a failure, exit code 1, not 128+N.
    return Outcome(ExitCode.FAILURE, "signal", detail)


def _report(
    agent: FtElasticAgent | None, outcome: Outcome, status_file: str | None, extra: dict[str, Any]
) -> None:
    restarts = agent.restarts_done if agent is not None else 0
    hangs = agent.hangs_detected if agent is not None else 0
    level = logging.INFO if outcome.exit_code == 0 else logging.ERROR
    logger.log(
        level,
        "ft-launcher exits %d (%s): %s [restarts: %d, hangs detected: %d]",
        outcome.exit_code,
        outcome.reason,
        outcome.detail,
        restarts,
        hangs,
    )
    if status_file:
        status = {
            "exit_code": int(outcome.exit_code),
            "reason": outcome.reason,
            "detail": outcome.detail,
            "restarts": restarts,
            "hangs_detected": hangs,
            "failures": agent.attempt_causes if agent is not None else [],
            "hang_verdicts": agent.verdicts if agent is not None else [],
            "diagnoses": agent.diagnoses if agent is not None else [],
            **extra,
        }
        tmp = f"{status_file}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(status, fh, indent=2)
        os.replace(tmp, status_file)
