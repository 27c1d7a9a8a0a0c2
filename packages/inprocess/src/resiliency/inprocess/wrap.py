"""``Wrapper`` and ``CallWrapper``: restart the wrapped function in the same processes.

On a fault in any rank (an exception, a hang seen by a monitor thread, a peer's fault seen
through the store, a dead peer) every surviving rank aborts its process groups, runs
``finalize`` and ``health_check``, meets the others at a store barrier where ranks are
reassigned, and calls the function again. See docs/inprocess.md.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import inspect
import logging
import sys
import threading
import time
import typing
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, Literal, TypeVar

import torch.distributed as dist

from resiliency.inprocess import (
    _after_fault,
    _arguments,
    _barriers,
    _endings,
    _gloo_sockets,
    _log_check,
    _rejoin,
    _stop_rule,
    _torch_compat,
)
from resiliency.inprocess._call_params import params_annotated
from resiliency.inprocess._failed_call import Fence, PendingRelease
from resiliency.inprocess._heartbeat import Heartbeat
from resiliency.inprocess._interrupt import Interrupter
from resiliency.inprocess._liveness import Liveness
from resiliency.inprocess._monitor import Monitor, monitor_timeouts
from resiliency.inprocess._monitor_process import MonitorProcess
from resiliency.inprocess._progress import Progress
from resiliency.inprocess._restart_report import RestartTimes, report_restart
from resiliency.inprocess._restart_store import RestartStore, open_store
from resiliency.inprocess._unabortable import respawn_request_path
from resiliency.inprocess.abort import Abort, AbortTorchDistributed, set_socket_baseline
from resiliency.inprocess.completion import Completion
from resiliency.inprocess.compose import Compose
from resiliency.inprocess.exception import (
    RankShouldRestart,
    RepeatedFaultError,
    RestartAbort,
    RestartError,
    UnassignedRankError,
)
from resiliency.inprocess.finalize import Finalize
from resiliency.inprocess.health_check import (
    ChainedGPUHealthCheck,
    ChainedNVLHealthCheck,
    HealthCheck,
    local_gpu_index,
)
from resiliency.inprocess.initialize import Initialize
from resiliency.inprocess.rank_assignment import (
    ActivateAllRanks,
    RankAssignment,
    RankAssignmentCtx,
    RankDiscarded,
    ShiftRanks,
)
from resiliency.inprocess.rank_filter import RankFilter
from resiliency.inprocess.state import Mode, State
from resiliency.inprocess.terminate import Terminate

log = logging.getLogger(__name__)

F = TypeVar("F", bound=Callable[..., Any])

_TERMINAL = (RestartAbort, KeyboardInterrupt, SystemExit, RestartError)


class Wrapper:
    """Decorator that restarts a distributed training function in-process on a fault.

    Keyword arguments, names, defaults and meanings are NVRx 0.4's (see
    docs/coming_from_nvidia_resiliency_ext.md for the few differences).

    Args:
        store_factory: returns the store the ranks coordinate through, called as
            ``store_factory(**store_kwargs)``; None: a TCPStore hosted by rank 0 at
            ``MASTER_ADDR:MASTER_PORT+1``.
        store_kwargs: for the built-in store: ``host_name``, ``port``, ``timeout``.
        initialize: run at the start of every iteration.
        abort: ends pending collectives on a fault (default: ``AbortTorchDistributed()``).
        finalize: rank-local clean-up after the abort.
        health_check: after the abort; raising takes the rank out of the job. With
            ``LOCAL_RANK`` set, ``restart_health_check`` runs it and then this rank's GPU checks.
        rank_assignment: reassigns ranks after a fault (default: shift ranks down, all active).
        rank_filter: deprecated (as in NVRx; a ``DeprecationWarning``): a
            ``rank_filter.RankFilter`` run on the state after ``rank_assignment``, every
            iteration, to choose the active ranks.
        monitor_thread_interval: how often the monitor thread looks for faults.
        monitor_process_interval: how often the monitor process checks that the rank's Python
            threads run (it ends a rank whose main thread holds the GIL past ``hard_timeout``).
        heartbeat_interval: how often a rank bumps its heartbeat counter.
        progress_watchdog_interval: accepted; progress is sampled every monitor interval.
        soft_timeout: no progress for this long: the rank is aborted and restarts.
        hard_timeout: still not out of the function this long after the last progress: the
            rank is terminated (stacks dumped, SIGTERM, SIGKILL after the grace time).
        heartbeat_timeout: a peer silent this long is declared gone.
        barrier_timeout: deadline of the start and restart barriers.
        completion_timeout: deadline of the barrier after the function returned.
        last_call_wait: accepted; the restart barrier already waits for every rank.
        termination_grace_time: between SIGTERM and SIGKILL of a terminated rank.
        monitor_process_logfile: the monitor process's log (``{rank}`` replaced); None: stderr.
        monitor_process_pidfile: the monitor process's pid file (``{rank}`` replaced), or None.
        enabled: False returns the function unwrapped.
        completion: run on every remaining rank once the function completed (NVRx 0.5).
        terminate: run on a rank whose call ends with an exception instead of a restart
            (NVRx 0.5).
        max_repeated_faults: stop (``RepeatedFaultError`` on every rank) when this many
            attempts in a row fail with the same cause on the same ranks and no progress
            (``ping()``, a completed ``atomic()``) in between; None or 0: never. ``"auto"``: 3,
            or never when a ``RetryController(max_iterations=...)`` bounds the restarts.

    Raises:
        ConfigError: a wrong type, an unknown argument, or timeouts out of order.
    """

    def __init__(
        self,
        *,
        store_factory: Callable[..., dist.Store] | None = None,
        store_kwargs: dict[str, Any] | None = None,
        initialize: Initialize | None = None,
        abort: Abort | None = None,
        finalize: Finalize | None = None,
        health_check: HealthCheck | None = None,
        rank_assignment: RankAssignment | None = None,
        rank_filter: RankFilter | None = None,
        monitor_thread_interval: timedelta = timedelta(seconds=1),
        monitor_process_interval: timedelta = timedelta(seconds=1),
        heartbeat_interval: timedelta = timedelta(seconds=1),
        progress_watchdog_interval: timedelta = timedelta(seconds=1),
        soft_timeout: timedelta = timedelta(seconds=60),
        hard_timeout: timedelta = timedelta(seconds=90),
        heartbeat_timeout: timedelta = timedelta(seconds=30),
        barrier_timeout: timedelta = timedelta(seconds=120),
        completion_timeout: timedelta = timedelta(seconds=120),
        last_call_wait: timedelta = timedelta(seconds=1),
        termination_grace_time: timedelta = timedelta(seconds=5),
        monitor_process_logfile: str | None = None,
        monitor_process_pidfile: str | None = None,
        enabled: bool = True,
        completion: Completion | None = None,
        terminate: Terminate | None = None,
        max_repeated_faults: int | Literal["auto"] | None = "auto",
        **unknown: Any,
    ) -> None:
        values = dict(locals())
        _arguments.check_all(values, unknown, tuple(inspect.signature(Wrapper).parameters))
        self.store_factory = store_factory
        self.store_kwargs = dict(store_kwargs or {})
        self.initialize = initialize
        self.abort = AbortTorchDistributed() if abort is None else abort
        self.finalize = finalize
        self.health_check = health_check
        gpu = local_gpu_index()  # NVRx 0.5: Compose(user's, GPU, NVLink), so NVLink runs first
        users = health_check.instances if isinstance(health_check, Compose) else [health_check]
        gpu_checks = () if gpu is None else (ChainedGPUHealthCheck(gpu), ChainedNVLHealthCheck(gpu))
        parts = [c for c in (*users, *gpu_checks) if c is not None]
        self.restart_health_check = Compose(*parts) if gpu_checks else health_check
        self.rank_assignment = rank_assignment or Compose(ActivateAllRanks(), ShiftRanks())
        self.rank_filter = rank_filter
        self.completion = completion
        self.terminate = terminate
        self.timeouts = {name: values[name].total_seconds() for name in _arguments.TIMEDELTAS}
        self.enabled = enabled
        self.max_repeated_faults = _arguments.repeat_limit(max_repeated_faults, initialize)
        self.monitor_process_logfile = monitor_process_logfile
        self.monitor_process_pidfile = monitor_process_pidfile

    def __call__(self, fn: F) -> F:
        """Wrap ``fn``; each call of the result runs the restart loop around it."""
        if not self.enabled:
            return fn

        @functools.wraps(fn)
        def wrapped(*args: Any, **kwargs: Any) -> Any:
            _log_check.warn_if_unconfigured(log)
            with CallWrapper(self) as call_wrapper:
                return call_wrapper(fn, args, kwargs)

        return typing.cast(F, wrapped)


class CallWrapper:
    """One call of a wrapped function: its state, store and restart loop.

    The wrapped function receives it through any parameter annotated ``CallWrapper`` (or
    ``Optional[CallWrapper]``).
    """

    def __init__(self, wrapper: Wrapper) -> None:
        _torch_compat.require_no_process_group()
        self._excepthook = sys.excepthook  # as it was before any iteration's process group
        self.wrapper = wrapper
        self.state = State.from_env()
        self.timeouts = wrapper.timeouts
        self.atomic_lock = threading.RLock()
        self.progress = Progress()
        self.interrupter = Interrupter()
        self._heartbeat: Heartbeat | None = None
        self._monitor_process: MonitorProcess | None = None
        self._members = list(range(self.state.world_size))
        self._marks = 0  # progress marks of this iteration: ping() and completed atomic()
        self._joining: int | None = None  # the running job's iteration a respawned rank joins
        self._hosting = False
        self._fence = Fence()  # a failed call's objects are freed without a full heap scan
        try:
            raw, self._store_ports, self._hosting = open_store(
                wrapper.store_factory,
                wrapper.store_kwargs,
                rank=self.state.rank,
                world_size=self.state.world_size,
                timeout=self.timeouts["barrier_timeout"],
            )
            self.store = RestartStore(raw)
            self._raw_store = raw
            self._heartbeat = Heartbeat(
                lambda: self.store, self.state.initial_rank, self.timeouts["heartbeat_interval"]
            )
            self._heartbeat.start()
            self._monitor_process = MonitorProcess(
                rank=self.state.initial_rank,
                timeouts=self.timeouts,
                respawn_request=respawn_request_path(hosting_store=self._hosting),
                logfile=wrapper.monitor_process_logfile,
                pidfile=wrapper.monitor_process_pidfile,
            )
            # A process the launcher respawned joins the running job (its start barrier is long
            # passed); the heartbeat first, so the others never see this rank silent.
            self._joining = _rejoin.joining(self.store)
            if self._joining is None:
                state, deadline = self.state, self.timeouts["barrier_timeout"]
                _barriers.start_barrier(self.store, state.rank, state.world_size, deadline)
        except BaseException as exc:
            _rejoin.refuse(exc)  # a respawned process that could not even reach the job
            self._shutdown()
            raise

    def __enter__(self) -> CallWrapper:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._shutdown()

    def _shutdown(self) -> None:
        try:
            if getattr(self, "store", None) is not None:
                _barriers.leave(
                    self.store,
                    me=self.state.initial_rank,
                    hosting=self._hosting,
                    world=self.state.initial_world_size,
                    timeout=self.timeouts["completion_timeout"],
                )
        except Exception as exc:
            log.warning("rank %d: leaving the restart store failed: %s", self.state.rank, exc)
        finally:
            if self._heartbeat is not None:
                self._heartbeat.stop(self.timeouts["heartbeat_interval"] + 1.0)
            if self._monitor_process is not None:
                self._monitor_process.close()
            self.interrupter.close()
            self._fence.open()
            # The heartbeat's store getter refers back to this object: a cycle that held the
            # store (and rank 0's port) until a GC pass, so a second call could not bind it.
            self._heartbeat = None
            for name in ("_monitor", "store", "_raw_store"):
                self.__dict__.pop(name, None)

    @property
    def iteration(self) -> int:
        """Index of the current restart iteration (0 for the first call)."""
        return self.state.iteration

    def ping(self) -> None:
        """Report progress: once pinged in an iteration the rank must ping within the soft and
        hard timeouts (NVRx's manual clock), and the stop rule counts the attempt as progress."""
        self.progress.ping()
        self._marks += 1

    @contextlib.contextmanager
    def disable_hang_protection(self) -> Iterator[None]:
        """A block exempt from the soft and hard timeouts (a long compile, a slow load): no
        restart and no kill for a lack of progress inside it, and the clocks start afresh at
        its end. An exception, or a peer's fault, still restarts. Blocks nest (NVRx 0.5)."""
        self.progress.suspend()
        if self._monitor_process is not None:
            self._monitor_process.suspend()
        try:
            yield
        finally:
            if self._monitor_process is not None:
                self._monitor_process.resume()
            self.progress.resume()

    @contextlib.contextmanager
    def atomic(self, *, progress: bool = True) -> Iterator[None]:
        """A block the abort never runs in the middle of (e.g. an optimizer step); a restart
        request that comes while it runs, or waits to start, is raised when it ends.

        Args:
            progress: whether a completed block counts as progress for the stop rule
                (``max_repeated_faults``); False for clean-up that every failed attempt also
                runs, such as closing a checkpoint manager in a ``finally``.
        """
        # deferred() outside the lock: the monitor signals while it holds the lock
        with self.interrupter.deferred(), self.atomic_lock:
            yield
            if progress:
                self._marks += 1

    def __call__(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> Any:
        """Run ``fn`` until it returns on every active rank, restarting it on faults."""
        kwargs = dict(kwargs)
        for name in params_annotated(fn, CallWrapper):
            if kwargs.get(name) is None:
                kwargs[name] = self
        try:
            if self._joining is not None:
                self._members = _rejoin.take_place(self.store, self.state, self._joining)
                now = time.monotonic()
                self._meet(self._joining, None, RestartTimes(now, now, now, now, now))
                _rejoin.announce()
            else:
                self._assign(set())
                self.state.set_distributed_vars()
            while True:
                exc, ret = self._run_iteration(fn, args, kwargs)
                if exc is None:
                    break
                self._restart(exc)
        except BaseException as ending:
            _endings.terminated(self.wrapper.terminate, self.state, ending)
            raise
        _endings.completed(self.wrapper.completion, self.state)
        return ret

    def _assign(self, terminated: set[int]) -> None:
        """Reassign ranks (``rank_assignment``, then the deprecated ``rank_filter``)."""
        ctx = RankAssignmentCtx(self.state, self._raw_store, terminated)
        state = self.wrapper.rank_assignment(ctx).state
        if self.wrapper.rank_filter is not None:
            state = self.wrapper.rank_filter(state)
        self.state = state

    def _run_iteration(
        self, fn: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> tuple[BaseException | None, Any]:
        state = self.state
        store = self.store
        store.enter(state.iteration, state.initial_rank, state.rank)
        peers = [r for r in self._members if r != state.initial_rank]
        self.progress.reset()
        self._marks = 0
        _torch_compat.fresh_iteration(self._excepthook)
        set_socket_baseline(_gloo_sockets.snapshot(), self._store_ports)
        monitor = Monitor(
            store=store,
            state=state.freeze(),
            peers=peers,
            progress=self.progress,
            interrupter=self.interrupter,
            abort=self.wrapper.abort,
            atomic_lock=self.atomic_lock,
            hosting_store=self._hosting,
            timeouts=monitor_timeouts(self.timeouts),
        )
        self._monitor = monitor
        started = time.monotonic()
        monitor.start()
        self._fence.close()
        try:
            if self.wrapper.initialize is not None:
                self.wrapper.initialize(state.freeze())
            ret = None
            if state.mode is Mode.INITIALIZED:  # a fault of this iteration, as in NVRx
                raise UnassignedRankError(state.rank)
            if state.mode == Mode.ACTIVE:
                name, size = getattr(fn, "__name__", fn), state.active_world_size
                log.info(
                    "rank %d: iteration %d: calling %s (world size %d)",
                    *(state.rank, state.iteration, name, size),
                )
                self.interrupter.arm()
                try:
                    ret = fn(*args, **kwargs)
                finally:
                    self.interrupter.disarm()
                    # back in the wrapper, returned or raised: not terminated from now on
                    monitor.main_thread_returned()
                store.complete(state.iteration)
            _barriers.completion_barrier(
                store,
                iteration=state.iteration,
                me=state.rank,
                active=state.active_world_size or 0,
                timeout=self.timeouts["completion_timeout"],
            )
            log.info(
                "rank %d: iteration %d: completed in %.3f s",
                state.rank,
                state.iteration,
                time.monotonic() - started,
            )
            return None, ret
        except (RankShouldRestart, UnassignedRankError) as exc:  # restarted, as in NVRx
            return exc, None
        except _TERMINAL as exc:
            self.store.leave_job(self.state, exc)
            raise
        except Exception as exc:
            return exc, None
        finally:
            monitor.stop()

    def _restart(self, exc: BaseException) -> None:
        state, store, monitor = self.state, self.store, self._monitor
        started = time.monotonic()
        it = state.iteration
        own = _after_fault.record(exc, state=state, store=store, monitor=monitor)
        state.fn_exception = exc if own else None
        if not monitor.aborted.is_set() and self.wrapper.abort is not None:
            _after_fault.abort(self.wrapper.abort, state)
        aborted = time.monotonic()
        try:
            check = self.wrapper.restart_health_check
            _after_fault.finalize_and_check(self.wrapper.finalize, check, state)
        except (*_TERMINAL, Exception) as terminal:
            self.store.leave_job(self.state, terminal)
            raise
        now = time.monotonic()
        self._meet(it, exc, RestartTimes(started, aborted, now, now, now))

    def _meet(self, it: int, exc: BaseException | None, times: RestartTimes) -> None:
        """Meet the others at the restart barrier of ``it``, then go on to the next iteration
        as the survivors agreed (``exc``: this rank's failed call, freed after the barrier)."""
        state = self.state
        store = self.store
        store.add_progress(it, self._marks)
        failed = None if exc is None else PendingRelease(exc, self._fence, times.aborted)
        survivors = _barriers.restart_barrier(
            store,
            iteration=it,
            me=state.initial_rank,
            members=self._members,
            liveness=Liveness(store, self.timeouts["heartbeat_timeout"]),
            timeout=self.timeouts["barrier_timeout"],
            while_waiting=None if failed is None else failed.if_drained,
        )
        if state.initial_rank not in survivors:
            discarded = RankDiscarded(
                f"initial rank {state.initial_rank} is not among the survivors {survivors} of "
                f"iteration {it} (it was reported gone)"
            )
            self.store.leave_job(self.state, discarded)
            raise discarded
        try:
            _stop_rule.check(
                store,
                iteration=it,
                ranks=list(range(state.initial_world_size)),
                limit=self.wrapper.max_repeated_faults,
            )
        except RepeatedFaultError as repeated:
            self.store.leave_job(self.state, repeated)
            raise
        met = time.monotonic()
        if failed is not None:
            failed.now()
        lost = [r for r in self._members if r not in survivors]
        ranks_then = [store.rank_in(it, r) for r in lost]  # numbered as in iteration ``it``
        terminated_now = {r for r in ranks_then if r is not None}
        self._assign(terminated_now)
        state = self.state
        state.advance()
        state.set_distributed_vars()
        members, self._members = self._members, survivors
        times = dataclasses.replace(times, met=met, done=time.monotonic())
        report_restart(store, state, failed=it, members=members, survivors=survivors, times=times)
