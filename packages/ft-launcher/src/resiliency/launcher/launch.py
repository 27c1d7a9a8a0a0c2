"""Turn parsed ``ft-launcher`` arguments into a running job and an exit code."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import uuid
from types import FrameType
from typing import Any

from torch.distributed.elastic.agent.server.api import RunResult
from torch.distributed.elastic.multiprocessing import SignalException
from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
from torch.distributed.elastic.rendezvous import RendezvousClosedError, RendezvousParameters
from torch.distributed.elastic.rendezvous import registry as rdzv_registry
from torch.distributed.run import config_from_args as torchrun_config_from_args
from torch.distributed.run import parse_min_max_nnodes

from resiliency.ft import FaultToleranceConfig
from resiliency.launcher._torch_compat import make_worker_spec
from resiliency.launcher.agent import AgentSettings, FtElasticAgent, Outcome
from resiliency.launcher.exit_codes import ExitCode
from resiliency.launcher.goodput_events import GoodputEvents
from resiliency.launcher.health import (
    CallableHealthCheck,
    CommandHealthCheck,
    HealthCheck,
    NvmlGpuHealthCheck,
)
from resiliency.launcher.monitors import MonitorSet
from resiliency.launcher.options import LauncherOptions
from resiliency.launcher.policy import policy_from_name
from resiliency.launcher.preemption import Preemption, clean_up, is_preempted
from resiliency.launcher.rendezvous import FreshStoreRendezvousHandler
from resiliency.launcher.supervision import start_supervision

__all__ = ["build_health_checks", "launch"]

logger = logging.getLogger(__name__)

_HANDLED_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT")


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
) -> int:
    """Run the job on this node until it ends; return the launcher's exit code.

    Args:
        args: parsed arguments (torchrun's and the fault-tolerance group).
        ft_cfg: the rank monitors' configuration.
        options: the launcher's own options.
        health_checks: run before every (re)join of the rendezvous.

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
    term_timeout = options.term_timeout
    if term_timeout is None:
        term_timeout = float(config.shutdown_timeout or 30)

    params = RendezvousParameters(
        backend=config.rdzv_backend,
        endpoint=config.rdzv_endpoint,
        run_id=config.run_id,
        min_nodes=config.min_nodes,
        max_nodes=config.max_nodes,
        local_addr=config.local_addr,
        **config.rdzv_configs,
    )
    rdzv_handler = FreshStoreRendezvousHandler(
        rdzv_registry.get_rendezvous_handler(params), config.local_addr
    )
    spec = make_worker_spec(
        role=config.role,
        local_world_size=config.nproc_per_node,
        entrypoint=entrypoint,
        args=tuple(entry_args),
        rdzv_handler=rdzv_handler,
        max_restarts=config.max_restarts,
        monitor_interval=config.monitor_interval,
        local_addr=config.local_addr,
        event_log_handler=config.event_log_handler,
        numa_options=getattr(config, "numa_options", None),
        duplicate_stdout_filters=getattr(config, "duplicate_stdout_filters", None),
        duplicate_stderr_filters=getattr(config, "duplicate_stderr_filters", None),
        virtual_local_rank=getattr(config, "virtual_local_rank", False),
    )
    preemption = Preemption(term_timeout)
    monitors = MonitorSet(ft_cfg, config.nproc_per_node)
    try:
        agent = FtElasticAgent(
            spec,
            config.logs_specs,
            monitors=monitors,
            settings=AgentSettings(
                ft_cfg=ft_cfg,
                policy=policy_from_name(options.restart_policy),
                min_nodes=config.min_nodes,
                workers_stop_timeout=options.workers_stop_timeout,
                health_checks=health_checks,
                finished_flag_file=options.finished_flag_file,
                preemption=preemption,
            ),
            start_method=config.start_method,
            log_line_prefix_template=config.log_line_prefix_template,
            shutdown_timeout=term_timeout,
        )
        agent.goodput = goodput
    except BaseException:
        # The try/finally below cleans up only once the agent exists; until then nothing else
        # would stop the monitors or remove their 0700 socket directory and the exit-info one.
        monitors.stop_all()
        clean_up(preemption)
        raise
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

    close_rendezvous = True
    supervision = None
    result: RunResult | None = None
    try:
        supervision = start_supervision(args, agent, monitors)  # --supervisor / --status-port
        result = agent.run()
        outcome = agent.outcome or _outcome_without_verdict(agent)
    except SignalException as exc:
        _install_signal_handlers(args.signals_to_handle, _ignore_further_signals)
        close_rendezvous = False  # like torchrun: a signalled node must not end the job for all
        outcome = _outcome_after_signal(agent, exc.sigval)
    except RendezvousClosedError:
        outcome = _outcome_without_verdict(agent)
    except Exception as exc:
        if is_preempted(preemption, agent):  # e.g. the node hosting the store left first
            logger.warning("after the workers' emergency checkpoint: %r", exc)
        else:
            logger.exception("ft-launcher failed")
        outcome = Outcome(ExitCode.FAILURE, "launcher_error", f"{type(exc).__name__}: {exc}")
    finally:
        _install_signal_handlers(args.signals_to_handle, _ignore_further_signals)
        if supervision is not None:
            supervision.stop()
        monitors.stop_all()
    if close_rendezvous and not agent.leaves_rendezvous_open():
        try:
            rdzv_handler.shutdown()
        except Exception:  # the store host may be gone already; nothing left to close
            logger.warning("closing the rendezvous failed", exc_info=True)
    if outcome.exit_code != ExitCode.PREEMPTED and (detail := is_preempted(preemption, agent)):
        outcome = Outcome(ExitCode.PREEMPTED, "preempted", detail)  # e.g. after a forwarded SIGTERM
    _report(agent, outcome, options.exit_status_file, preemption.status_fields())
    goodput.job_ended(int(outcome.exit_code), outcome.reason)
    clean_up(preemption)
    if outcome.reason == "restarts_exhausted" and result is not None and result.failures:
        # As torchrun: the failure table with the root cause (and, under @record, the failed
        # worker's error file copied to this launcher's), exit code 1.
        raise ChildFailedError(
            name=_entrypoint_name(entrypoint, entry_args), failures=result.failures
        )
    return int(outcome.exit_code)


def _entrypoint_name(entrypoint: Any, args: list[str]) -> str:
    """The script's name as torchrun shows it: the first non-option argument of the Python
    interpreter, else the entrypoint itself."""
    if entrypoint == sys.executable:
        return next((arg for arg in args if not arg.startswith("-")), "")
    return str(entrypoint)


def _outcome_without_verdict(agent: FtElasticAgent) -> Outcome:
    """The agent stopped without deciding (rendezvous closed by another node)."""
    shared = agent._shared
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


def _outcome_after_signal(agent: FtElasticAgent, sig: signal.Signals) -> Outcome:
    codes = agent.worker_returncodes()
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
    agent: FtElasticAgent, outcome: Outcome, status_file: str | None, extra: dict[str, Any]
) -> None:
    level = logging.INFO if outcome.exit_code == 0 else logging.ERROR
    logger.log(
        level,
        "ft-launcher exits %d (%s): %s [restarts: %d, hangs detected: %d]",
        outcome.exit_code,
        outcome.reason,
        outcome.detail,
        agent.restarts_done,
        agent.hangs_detected,
    )
    if status_file:
        status = {
            "exit_code": int(outcome.exit_code),
            "reason": outcome.reason,
            "detail": outcome.detail,
            "restarts": agent.restarts_done,
            "hangs_detected": agent.hangs_detected,
            "failures": agent.attempt_causes,
            "hang_verdicts": agent.verdicts,
            **extra,
        }
        tmp = f"{status_file}.tmp"
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(status, fh, indent=2)
        os.replace(tmp, status_file)
