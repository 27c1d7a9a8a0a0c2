"""Run a job's launcher command(s) and inject a fault plan into them, from outside."""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from resiliency.goodput import DIR_ENV, read_ledger
from resiliency.simulator._contracts import HOOK_ENV, SIM_NODE_ENV
from resiliency.simulator._proctree import Proc, descendants, kill_all, read_proc, workers
from resiliency.simulator.errors import InjectionError, SimulatorError
from resiliency.simulator.injectors import (
    SlowDown,
    committed_files,
    fill_disk,
    inject_into_rank,
    lose_node,
    preempt_node,
    tear_newest_file,
)
from resiliency.simulator.plan import NODE_FAULTS, STORAGE_FAULTS, Fault, FaultPlan

__all__ = ["Injection", "JobRunner", "RunnerOptions"]

logger = logging.getLogger(__name__)


@dataclass
class RunnerOptions:
    """How the job is started and how faults act on it.

    Attributes:
        command: the launcher command; ``{node}`` in any argument becomes the node index.
        nodes: how many copies of the command to start (nodes of one job, on loopback).
        node_start_delay_s: the pause between starting two nodes (node 0 hosts the store).
        restart_nodes_after_s: start a node's launcher again this long after it exited with a
            non-zero code (a failure, a preemption, a lost node), as a scheduler would; None
            leaves it down.
        grace_s: SIGKILL follows a preemption's SIGTERM after this long.
        slow_ratio: the stopped share of each duty cycle of a ``slow`` fault.
        slow_duration_s: how long a ``slow`` fault lasts.
        ckpt_dir: the checkpoint directory ``torn_checkpoint`` and ``disk_full`` act on.
        local_ckpt_dir: a node's local checkpoint directory (``{node}`` substituted), wiped by
            ``node_loss``.
        disk_full_hold_s: how long ``disk_full`` keeps the filesystem full.
        goodput_dir: the job's ledger directory, given to the job as ``RESILIENCY_GOODPUT_DIR``.
        env: extra environment for the job.
        wait_for_workers_s: how long an injection waits for a victim to exist (a storage
            fault: for the job's first committed checkpoint).
        stdout: where the launchers' output goes (an open file); None inherits ours.
        faults_from_first_step: count the faults' times from the job's first training step
            (its first ``step`` event in ``goodput_dir``, waited for up to
            ``wait_for_workers_s``) instead of from the launchers' start, so that the same plan
            hits training alike on a fast and on a slow machine.
    """

    command: list[str]
    nodes: int = 1
    node_start_delay_s: float = 3.0
    restart_nodes_after_s: float | None = None
    grace_s: float = 10.0
    slow_ratio: float = 0.5
    slow_duration_s: float = 10.0
    ckpt_dir: Path | None = None
    local_ckpt_dir: str | None = None
    disk_full_hold_s: float = 10.0
    goodput_dir: Path | None = None
    env: dict[str, str] = field(default_factory=dict)
    wait_for_workers_s: float = 60.0
    stdout: IO[Any] | None = None
    faults_from_first_step: bool = False

    def __post_init__(self) -> None:
        if self.faults_from_first_step and self.goodput_dir is None:
            raise SimulatorError("faults_from_first_step needs goodput_dir (the job's ledger)")


@dataclass
class Injection:
    """What happened to one planned fault."""

    fault: Fault
    injected_mono: float | None = None
    injected_wall: float | None = None
    victim: str = ""
    action: str = ""
    error: str = ""


class JobRunner:
    """Starts the job, injects the plan at its times, and tears everything down by pid."""

    def __init__(self, options: RunnerOptions) -> None:
        self.options = options
        self._nodes: dict[int, subprocess.Popen[bytes]] = {}
        self._procs: dict[int, Proc] = {}
        self._restart_at: dict[int, float] = {}
        self._slowdowns: list[SlowDown] = []
        self.exit_codes: dict[int, int] = {}
        self.t0 = 0.0
        self.t0_wall = 0.0

    # -- the job's launchers -------------------------------------------------------------

    def _node_command(self, node: int) -> list[str]:
        return [arg.replace("{node}", str(node)) for arg in self.options.command]

    def _start_node(self, node: int) -> None:
        env = {**os.environ, **self.options.env, HOOK_ENV: "1"}
        env[SIM_NODE_ENV] = str(node)
        if self.options.goodput_dir is not None:
            env[DIR_ENV] = str(self.options.goodput_dir)
        popen = subprocess.Popen(
            self._node_command(node),
            env=env,
            start_new_session=True,
            stdout=self.options.stdout,
            stderr=subprocess.STDOUT if self.options.stdout is not None else None,
        )
        self._nodes[node] = popen
        proc = read_proc(popen.pid)
        if proc is not None:
            self._procs[node] = proc
        logger.info("node %d: launcher pid %d started", node, popen.pid)

    def start(self) -> None:
        """Start every node's launcher, node 0 first."""
        self.t0, self.t0_wall = time.monotonic(), time.time()
        for node in range(self.options.nodes):
            if node:
                time.sleep(self.options.node_start_delay_s)
            self._start_node(node)

    def running(self) -> bool:
        """Whether any launcher is still running or due to be started again."""
        self._reap()
        return bool(self._restart_at) or any(p.poll() is None for p in self._nodes.values())

    def _reap(self) -> None:
        now = time.monotonic()
        for node, popen in self._nodes.items():
            code = popen.poll()
            if code is not None and node not in self.exit_codes:
                self.exit_codes[node] = code
                logger.info("node %d: launcher exited with %d", node, code)
                # A scheduler requeues a node that failed or was preempted, never one whose
                # job finished (exit 0).
                restart = self.options.restart_nodes_after_s
                if code != 0 and restart is not None and node not in self._restart_at:
                    self._restart_at[node] = now + restart
                    logger.info("node %d: starting it again in %.0f s", node, restart)
        for node, when in list(self._restart_at.items()):
            if now >= when:
                del self._restart_at[node]
                self.exit_codes.pop(node, None)
                self._start_node(node)

    # -- injection ----------------------------------------------------------------------------

    def _live_nodes(self) -> list[int]:
        return [n for n, p in self._nodes.items() if p.poll() is None]

    def _victim_rank(self, fault: Fault) -> tuple[int, Proc]:
        deadline = time.monotonic() + self.options.wait_for_workers_s
        while True:
            ranks: dict[int, Proc] = {}
            for node in self._live_nodes():
                ranks.update(workers(self._nodes[node].pid))
            if ranks:
                rank = sorted(ranks)[fault.victim % len(ranks)]
                return rank, ranks[rank]
            if time.monotonic() > deadline or not self.running():
                raise InjectionError(
                    f"no worker to inject {fault.kind} into after "
                    f"{self.options.wait_for_workers_s:.0f} s"
                )
            time.sleep(0.1)

    def _wait_for_first_checkpoint(self, fault: Fault, root: Path) -> None:
        # A storage fault due before the job's first save would hit a job that is still
        # starting (on a loaded machine that takes many seconds) and test nothing: it waits,
        # as a rank fault waits for its victim to exist.
        deadline = time.monotonic() + self.options.wait_for_workers_s
        while not committed_files(root):
            if time.monotonic() > deadline or not self.running():
                raise InjectionError(
                    f"no committed checkpoint under {root} to {fault.kind} after "
                    f"{self.options.wait_for_workers_s:.0f} s"
                )
            time.sleep(0.1)

    def inject(self, fault: Fault) -> Injection:
        """Inject one fault now; a failure to inject is recorded, never raised."""
        record = Injection(fault=fault, injected_mono=time.monotonic(), injected_wall=time.time())

        def acting() -> None:
            # The time it acts: after any wait for its victim or a first checkpoint, and before
            # an action that itself waits (a preemption's grace period).
            record.injected_mono, record.injected_wall = time.monotonic(), time.time()

        try:
            record.victim, record.action = self._inject(fault, acting)
        except (InjectionError, OSError) as exc:
            record.error = str(exc)
            logger.warning("fault %s not injected: %s", fault.describe(), exc)
        else:
            logger.warning("injected %s into %s: %s", fault.kind, record.victim, record.action)
        return record

    def _inject(self, fault: Fault, acting: Callable[[], None]) -> tuple[str, str]:
        opts = self.options
        if fault.kind in NODE_FAULTS:
            live = self._live_nodes()
            if not live:
                raise InjectionError(f"no live node to {fault.kind}")
            node = live[fault.victim % len(live)]
            proc = self._procs[node]
            acting()
            if fault.kind == "preempt":
                action = preempt_node(proc, opts.grace_s)
            else:
                local = opts.local_ckpt_dir
                action = lose_node(
                    proc, Path(local.replace("{node}", str(node))) if local else None
                )
            if opts.restart_nodes_after_s is not None:
                self._restart_at[node] = time.monotonic() + opts.restart_nodes_after_s
            return f"node {node}", action
        if fault.kind in STORAGE_FAULTS:
            if opts.ckpt_dir is None:
                raise InjectionError(f"{fault.kind} needs --ckpt-dir")
            self._wait_for_first_checkpoint(fault, opts.ckpt_dir)
            acting()
            if fault.kind == "torn_checkpoint":
                return str(opts.ckpt_dir), tear_newest_file(opts.ckpt_dir, fault.seed)
            return str(opts.ckpt_dir), fill_disk(opts.ckpt_dir, opts.disk_full_hold_s)
        rank, proc = self._victim_rank(fault)
        acting()
        if fault.kind == "slow":
            slow = SlowDown(proc, ratio=opts.slow_ratio, duration_s=opts.slow_duration_s)
            slow.start()
            self._slowdowns.append(slow)
            return f"rank {rank}", (
                f"pid {proc.pid} stopped {opts.slow_ratio:.0%} of the time "
                f"for {opts.slow_duration_s:.0f} s"
            )
        return f"rank {rank}", inject_into_rank(fault.kind, proc)

    # -- the whole run ------------------------------------------------------------------------

    def run(
        self,
        plan: FaultPlan,
        duration_s: float | None,
        record: Callable[[Injection], None] | None = None,
    ) -> list[Injection]:
        """Start the job, inject ``plan`` on schedule, stop at ``duration_s`` or when the job ends.

        Args:
            plan: the faults.
            duration_s: stop the job after this many seconds; None waits for it to end.
            record: a callable ``(Injection) -> None`` told of every injection (the ledger).

        Returns:
            One record per planned fault that came due while the job ran.
        """
        done: list[Injection] = []
        self.start()
        pending = list(plan.faults)
        origin = None if self.options.faults_from_first_step else self.t0
        try:
            while self.running():
                elapsed = time.monotonic() - self.t0
                if duration_s is not None and elapsed >= duration_s:
                    logger.info("duration of %.0f s reached; stopping the job", duration_s)
                    break
                if origin is None:
                    origin = self._first_step_seen(elapsed)
                if origin is not None and pending and time.monotonic() - origin >= pending[0].at_s:
                    injection = self.inject(pending.pop(0))
                    done.append(injection)
                    if record is not None:
                        record(injection)
                    continue
                time.sleep(0.05)
        finally:
            self.stop()
        return done

    def _first_step_seen(self, elapsed: float) -> float | None:
        """The monotonic time the first step was seen in the ledger, now; None before."""
        assert self.options.goodput_dir is not None
        if self.options.goodput_dir.is_dir() and read_ledger([self.options.goodput_dir]).steps:
            logger.info("first training step seen %.1f s after the start", elapsed)
            return time.monotonic()
        if elapsed > self.options.wait_for_workers_s:
            raise SimulatorError(
                f"no training step in {self.options.goodput_dir} within "
                f"{self.options.wait_for_workers_s:.0f} s of the start; the faults are timed "
                "from the first step (faults_from_first_step)"
            )
        return None

    def stop(self, grace_s: float = 10.0) -> None:
        """End every launcher and all it started: SIGTERM, then SIGKILL after ``grace_s``."""
        for slow in self._slowdowns:
            slow.stop()
        self._restart_at.clear()
        # Snapshot the trees first: once a launcher exits, its orphans are no longer its
        # descendants, and torch starts workers in process groups of their own.
        tree: list[Proc] = []
        for popen in self._nodes.values():
            if popen.poll() is None:
                tree.extend(descendants(popen.pid))
                try:
                    os.killpg(popen.pid, signal.SIGTERM)
                except ProcessLookupError:
                    continue
        deadline = time.monotonic() + grace_s
        for popen in self._nodes.values():
            try:
                popen.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                logger.warning("launcher pid %d ignored SIGTERM for %.0f s", popen.pid, grace_s)
        left = kill_all(tree)
        if left:
            logger.warning("killed %d leftover process(es) of the job", left)
        for popen in self._nodes.values():
            if popen.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(popen.pid, signal.SIGKILL)
            try:
                popen.wait(5.0)
            except subprocess.TimeoutExpired as exc:
                raise SimulatorError(f"launcher pid {popen.pid} survived SIGKILL") from exc
        self._reap()
