"""The ONE place that touches private details of torch.distributed.elastic.

Everything else in the launcher uses torch's public API plus the documented agent hooks
(``_start_workers``, ``_stop_workers``, ``_monitor_workers``, ``_shutdown``, ``_rendezvous``).
The private pieces this module wraps, each verified against the torch versions in
``TESTED_TORCH``:

* ``LocalElasticAgent._set_local_rank_env(worker_env, local_rank, spec)``: the per-worker
  environment hook; used to hand each worker its own monitor socket path.
* ``SimpleElasticAgent._invoke_run(role)``: the supervision loop; replaced by the launcher's own
  loop so restart policies, monitor events and workload control can decide.
* ``SimpleElasticAgent._exit_barrier()``: replaced so nodes that left the group under the
  min-healthy policy are not waited for.
* ``SimpleElasticAgent._rendezvous(worker_group)``: wrapped to run node health checks before
  every (re)join and to pick up the new round's store after it.
* ``SimpleElasticAgent._initialize_workers`` / ``_restart_workers``: called by the launcher's loop
  (rendezvous + start; stop + rendezvous + start).
* ``SimpleElasticAgent._remaining_restarts``, ``_exit_barrier_timeout`` and
  ``LocalElasticAgent._pcontext``: the restart budget, the exit barrier's limit and the worker
  process handles (exit codes after a shutdown).
* ``LocalElasticAgent._shutdown`` / ``_stop_workers``: their parameters changed across versions
  (``timeout``, ``is_restart``); overrides accept all, calls pass what this torch takes.
* ``torch.distributed.elastic.multiprocessing.api.get_subprocess_handler``: the name torch's
  ``SubprocessContext`` starts each worker with; :func:`worker_handler_factory` points it at the
  fork server's handler while ``--ft-preimport`` workers start (signature checked).
* ``PContext.close``: torch's context calls it without a timeout (a fixed 30 s before SIGKILL)
  when it stops the other workers after one failed; :meth:`CompatAgent.bound_worker_close`
  gives each new context's ``close`` the launcher's ``--workers-stop-timeout`` as its default.
* ``SubprocessContext.subprocess_handlers``, ``entrypoint``, ``args``, ``envs``, ``stdouts``,
  ``stderrs`` (and ``_numa_options``), and ``Worker.id`` (the pid torch's look expects):
  :meth:`CompatAgent.respawn_worker` starts one worker again in place
  (``--ft-inprocess-respawn``) before torch's poll would stop the others.
* ``torch.distributed.launcher.api.LocalElasticAgent``: the name ``launch_agent`` builds its
  agent from; :func:`run_launch_agent` points it at the launcher's agent for the one call, so
  torch's launcher path runs as under torchrun (``launch_agent(config, entrypoint, args)``
  checked by ``inspect.signature``).
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import re
import signal
import subprocess
import threading
from collections.abc import Callable, Iterator
from typing import Any

import torch
from torch.distributed.elastic.agent.server.api import WorkerGroup, WorkerSpec
from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from torch.distributed.elastic.multiprocessing import api as mp_api
from torch.distributed.launcher import api as launcher_api
from torch.distributed.launcher.api import LaunchConfig

from resiliency.launcher.errors import TorchVersionError

__all__ = [
    "MIN_TORCH",
    "TESTED_TORCH",
    "CompatAgent",
    "check_torch_version",
    "run_launch_agent",
    "worker_handler_factory",
]

logger = logging.getLogger(__name__)

# The floor is the oldest version CI runs: an older torch is not claimed to work, however likely.
MIN_TORCH = (2, 13)
TESTED_TORCH = ((2, 13),)


# The parameters of torch's LocalElasticAgent._shutdown have changed before: torch 2.4 took
# (death_sig, timeout), 2.5-2.7 added is_restart (also to _stop_workers), later versions dropped
# it again. They are read rather than assumed, so that a newer torch that changes them again is
# either served (overrides accept all of them; calls pass what this torch takes) or refused by
# check_torch_version with the parameter named.
_SHUTDOWN_PARAMS = frozenset(inspect.signature(LocalElasticAgent._shutdown).parameters)
_SHUTDOWN_KNOWN = frozenset({"self", "death_sig", "timeout", "is_restart"})


def _torch_version() -> tuple[int, int]:
    match = re.match(r"(\d+)\.(\d+)", torch.__version__)
    if match is None:  # pragma: no cover - torch always has a numeric version
        raise TorchVersionError(f"cannot read the torch version from {torch.__version__!r}")
    return int(match.group(1)), int(match.group(2))


def check_torch_version() -> tuple[int, int]:
    """Verify that the installed torch has the extension points the launcher relies on.

    Returns:
        The (major, minor) torch version.

    Raises:
        TorchVersionError: torch is too old or lacks a required agent hook.
    """
    version = _torch_version()
    if version < MIN_TORCH:
        raise TorchVersionError(
            f"ft-launcher needs torch>={MIN_TORCH[0]}.{MIN_TORCH[1]}; found {torch.__version__}"
        )
    missing = [
        name
        for name in (
            "_set_local_rank_env",
            "_invoke_run",
            "_exit_barrier",
            "_rendezvous",
            "_initialize_workers",
            "_restart_workers",
        )
        if not hasattr(LocalElasticAgent, name)
    ]
    if missing:
        raise TorchVersionError(
            f"torch {torch.__version__} lacks the elastic-agent hooks {missing} that ft-launcher "
            f"extends; install a torch version ft-launcher was tested with "
            f"({', '.join(f'{a}.{b}' for a, b in TESTED_TORCH)})"
        )
    unknown = [
        name
        for name, param in inspect.signature(LocalElasticAgent._shutdown).parameters.items()
        if name not in _SHUTDOWN_KNOWN and param.default is inspect.Parameter.empty
    ]
    if unknown:
        raise TorchVersionError(
            f"torch {torch.__version__}'s LocalElasticAgent._shutdown needs {unknown}, which "
            "ft-launcher does not know how to pass; install a torch version ft-launcher was "
            f"tested with ({', '.join(f'{a}.{b}' for a, b in TESTED_TORCH)})"
        )
    if version not in TESTED_TORCH:
        logger.warning(
            "ft-launcher was tested with torch %s; running on %s",
            ", ".join(f"{a}.{b}" for a, b in TESTED_TORCH),
            torch.__version__,
        )
    return version


# torch's launch_agent builds the agent by calling this module global by keyword.
_AGENT_GLOBAL = "LocalElasticAgent"
_LAUNCH_PARAMS = ("config", "entrypoint", "args")
_launch_lock = threading.Lock()


def run_launch_agent(
    config: LaunchConfig,
    entrypoint: Any,
    args: list[Any],
    make_agent: Callable[..., LocalElasticAgent],
) -> dict[int, Any]:
    """Run torch's own ``launch_agent`` with the agent ``make_agent`` builds.

    torch's launcher path (its rendezvous set-up, health-check server, metrics, events,
    ``ChildFailedError`` for ``@record`` and the closing of the rendezvous) runs unchanged; the
    only substitution is the agent class, which ``launch_agent`` takes from its module and
    has no parameter for.

    Args:
        config: torch's launch configuration (``torch.distributed.run.config_from_args``).
        entrypoint: the command or function the workers run.
        args: its arguments.
        make_agent: called with ``launch_agent``'s keyword arguments for ``LocalElasticAgent``
            (``spec``, ``logs_specs``, ...); returns the agent to run.

    Returns:
        The workers' return values, as ``launch_agent`` returns them.

    Raises:
        TorchVersionError: this torch's ``launch_agent`` is not the one ft-launcher extends.
        ChildFailedError: the workers failed (raised by torch, as under torchrun).
    """
    params = tuple(inspect.signature(launcher_api.launch_agent).parameters)
    if params[: len(_LAUNCH_PARAMS)] != _LAUNCH_PARAMS or not isinstance(
        getattr(launcher_api, _AGENT_GLOBAL, None), type
    ):
        raise TorchVersionError(
            f"torch {torch.__version__}'s launch_agent{params} no longer builds its agent from "
            f"{launcher_api.__name__}.{_AGENT_GLOBAL}; install a torch version ft-launcher was "
            f"tested with ({', '.join(f'{a}.{b}' for a, b in TESTED_TORCH)})"
        )
    with _launch_lock:  # the substitution is process-wide: one launch at a time
        original = getattr(launcher_api, _AGENT_GLOBAL)
        setattr(launcher_api, _AGENT_GLOBAL, make_agent)
        try:
            return launcher_api.launch_agent(config, entrypoint, args)
        finally:
            setattr(launcher_api, _AGENT_GLOBAL, original)


_HANDLER_GLOBAL = "get_subprocess_handler"
_HANDLER_PARAMS = ("entrypoint", "args", "env", "stdout", "stderr", "local_rank_id")
_handler_lock = threading.Lock()


@contextlib.contextmanager
def worker_handler_factory(factory: Callable[..., Any]) -> Iterator[None]:
    """Start workers through ``factory`` instead of torch's ``SubprocessHandler``.

    ``factory`` is called as torch calls ``get_subprocess_handler`` (by keyword) and returns an
    object with its attributes (``proc``, ``local_rank_id``, ``close(death_sig)``).

    Raises:
        TorchVersionError: this torch does not start workers through that function.
    """
    original = getattr(mp_api, _HANDLER_GLOBAL, None)
    params = tuple(inspect.signature(original).parameters) if callable(original) else ()
    if params[: len(_HANDLER_PARAMS)] != _HANDLER_PARAMS:
        raise TorchVersionError(
            f"torch {torch.__version__} no longer starts workers through "
            f"{mp_api.__name__}.{_HANDLER_GLOBAL}{params}; run without --ft-preimport"
        )
    with _handler_lock:
        setattr(mp_api, _HANDLER_GLOBAL, factory)
        try:
            yield
        finally:
            setattr(mp_api, _HANDLER_GLOBAL, original)


class CompatAgent(LocalElasticAgent):
    """``LocalElasticAgent`` with its private details turned into overridable methods.

    Subclasses implement :meth:`extra_worker_env`, :meth:`supervise` and
    :meth:`exit_barrier`, and read :attr:`remaining_restarts` / :meth:`worker_returncodes`.
    """

    # --- hooks for subclasses -------------------------------------------------------------
    def extra_worker_env(self, local_rank: int) -> dict[str, str]:
        """Return extra environment variables for the worker of ``local_rank``."""
        return {}

    def supervise(self, role: str) -> Any:
        """Run the supervision loop; returns a torch ``RunResult``."""
        return super()._invoke_run(role)

    def exit_barrier(self) -> None:
        """Wait for the other nodes once the local workers have finished."""
        super()._exit_barrier()

    def before_rendezvous(self) -> None:
        """Called before every (re)join of the rendezvous; raise to keep this node out."""

    def after_rendezvous(self, worker_group: WorkerGroup) -> None:
        """Called after every rendezvous round, once ranks and store are assigned."""

    def initialize_workers(self) -> None:
        """Rendezvous, then start the workers (torch's sequence, with this class's hooks)."""
        self._initialize_workers(self._worker_group)

    def restart_workers(self) -> None:
        """Stop the workers, rendezvous again, start them again."""
        self._restart_workers(self._worker_group)

    # --- private torch details --------------------------------------------------------------
    def shutdown_workers(
        self, death_sig: signal.Signals, *, timeout: float, is_restart: bool
    ) -> None:
        """torch's ``LocalElasticAgent._shutdown``: some versions take ``timeout``, some
        ``is_restart``, some both (checked once, by `check_torch_version`)."""
        kwargs: dict[str, Any] = {}
        if "timeout" in _SHUTDOWN_PARAMS:
            # Annotated int by torch, used as seconds to add to a clock: int() would cut
            # --term-timeout 1.5 to 1 s.
            kwargs["timeout"] = timeout
        if "is_restart" in _SHUTDOWN_PARAMS:
            kwargs["is_restart"] = is_restart
        LocalElasticAgent._shutdown(self, death_sig, **kwargs)

    def _set_local_rank_env(
        self, worker_env: dict[str, str | None], local_rank: int, spec: WorkerSpec
    ) -> None:
        super()._set_local_rank_env(worker_env, local_rank, spec)
        worker_env.update(self.extra_worker_env(local_rank))

    def _rendezvous(self, worker_group: WorkerGroup) -> None:
        self.before_rendezvous()
        super()._rendezvous(worker_group)
        self.after_rendezvous(worker_group)

    def _invoke_run(self, role: str = "default") -> Any:
        return self.supervise(role)

    def _exit_barrier(self) -> None:
        self.exit_barrier()

    @property
    def remaining_restarts(self) -> int:
        """Restarts this agent may still spend."""
        return int(self._remaining_restarts)

    @remaining_restarts.setter
    def remaining_restarts(self, value: int) -> None:
        self._remaining_restarts = value

    @property
    def exit_barrier_timeout(self) -> float:
        """Seconds the exit barrier may wait for the other nodes (torch's agent setting)."""
        return float(self._exit_barrier_timeout)

    @property
    def worker_group(self) -> WorkerGroup:
        """The agent's (single) worker group."""
        return self.get_worker_group()

    def bound_worker_close(
        self, seconds: float, on_close: Callable[[set[int]], None] | None = None
    ) -> None:
        """Give the current workers ``seconds`` between SIGTERM and SIGKILL when torch's process
        context stops them itself, after one failed (it calls ``close()`` without a timeout and
        would wait a fixed 30 s). A close with an explicit timeout keeps it.

        ``on_close`` is told, before each close signals them, the local ranks still running:
        the ranks the launcher itself stops (the failure diagnosis never blames them)."""
        pcontext = self._pcontext
        if pcontext is None:
            return
        close = pcontext.close

        def bounded_close(
            death_sig: signal.Signals | None = None, timeout: float = seconds
        ) -> None:
            if on_close is not None:
                on_close({lr for lr, code in self.worker_returncodes().items() if code is None})
            close(death_sig, timeout)  # type: ignore[arg-type]

        pcontext.close = bounded_close  # type: ignore[method-assign]

    def respawn_worker(
        self, local_rank: int, extra_env: dict[str, str], factory: Callable[..., Any] | None
    ) -> int | None:
        """Start the worker of ``local_rank`` again, alone, inside torch's process context.

        Same entrypoint, arguments, environment (plus ``extra_env``) and output files as torch
        gave it; torch keeps counting the local rank as running, now with the new process.

        Args:
            local_rank: the worker to start again (its process has ended).
            extra_env: added to its environment for this process only.
            factory: starts it (the fork server's handler); None: torch's own.

        Returns:
            The new pid; None for a context that starts no subprocesses (a function
            entrypoint), which cannot respawn one worker.
        """
        pcontext = self._pcontext
        handlers = getattr(pcontext, "subprocess_handlers", None)
        if pcontext is None or not handlers or local_rank not in handlers:
            return None
        make = factory if factory is not None else getattr(mp_api, _HANDLER_GLOBAL)
        kwargs: dict[str, Any] = {}
        numa = getattr(pcontext, "_numa_options", None)
        if numa is not None:
            kwargs["numa_options"] = numa
        handler = make(
            entrypoint=pcontext.entrypoint,
            args=pcontext.args[local_rank],
            env={**pcontext.envs[local_rank], **extra_env},
            stdout=pcontext.stdouts[local_rank],
            stderr=pcontext.stderrs[local_rank],
            local_rank_id=local_rank,
            **kwargs,
        )
        handlers[local_rank] = handler
        pid = int(handler.proc.pid)
        for worker in self._worker_group.workers:
            if worker.local_rank == local_rank:
                worker.id = pid  # torch's look compares the workers' ids with the context's pids
        return pid

    def worker_returncodes(self) -> dict[int, int | None]:
        """Return local rank -> exit code (None while running) of the current workers."""
        pcontext = self._pcontext
        if pcontext is None:
            return {}
        handlers = getattr(pcontext, "subprocess_handlers", None)
        if handlers:
            codes: dict[int, int | None] = {}
            for local_rank, handler in handlers.items():
                proc: subprocess.Popen[Any] = handler.proc
                codes[local_rank] = proc.poll()
            return codes
        # multiprocessing-based context (--run-path): exit codes via its process objects
        mp_context = getattr(pcontext, "_pc", None)
        processes = getattr(mp_context, "processes", None) if mp_context else None
        if processes:
            return {i: p.exitcode for i, p in enumerate(processes)}
        return {}
