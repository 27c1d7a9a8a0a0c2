"""How each fault kind is injected, from outside the training script.

Process faults go to a worker found among the launcher's descendants (by pid). ``hang``,
``hang_nogil`` and ``crash`` need the rank's cooperation to run code inside it: they are real-time
signals handled by the opt-in hook of ``resiliency.ft`` (enabled with ``RESILIENCY_FAULT_HOOK=1``,
which the simulator sets for the job). A rank without the hook is never sent one: the signal's
default action would kill it, which is a different fault.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from resiliency.simulator._contracts import HOOK_ENV, HOOK_SIGNALS
from resiliency.simulator._proctree import (
    Proc,
    catches_signal,
    descendants,
    kill_all,
    still_same,
)
from resiliency.simulator.errors import InjectionError

__all__ = [
    "HOOK_ENV",
    "HOOK_SIGNALS",
    "SlowDown",
    "fill_disk",
    "inject_into_rank",
    "lose_node",
    "preempt_node",
    "tear_newest_file",
]

logger = logging.getLogger(__name__)


def _hook_signal(kind: str) -> int:
    return int(signal.SIGRTMIN) + HOOK_SIGNALS[kind]


def inject_into_rank(kind: str, proc: Proc) -> str:
    """Inject a process fault into one worker.

    Args:
        kind: ``kill``, ``stop``, ``crash``, ``hang`` or ``hang_nogil``.
        proc: the worker, as found by pid.

    Returns:
        What was done, for the log.

    Raises:
        InjectionError: the worker is gone, or the kind needs the in-rank hook and the worker
            has none installed.
    """
    if not still_same(proc):
        raise InjectionError(f"worker pid {proc.pid} is gone; nothing to inject {kind} into")
    if kind == "kill":
        os.kill(proc.pid, signal.SIGKILL)
        return f"SIGKILL to pid {proc.pid}"
    if kind == "stop":
        os.kill(proc.pid, signal.SIGSTOP)
        return f"SIGSTOP to pid {proc.pid}"
    if kind in HOOK_SIGNALS:
        signum = _hook_signal(kind)
        if not catches_signal(proc.pid, signum):
            raise InjectionError(
                f"pid {proc.pid} has no fault hook for {kind!r} (signal {signum} not caught): "
                f"start the job's ranks with {HOOK_ENV}=1 and the resiliency.ft client"
            )
        os.kill(proc.pid, signum)
        return f"signal {signum} ({kind} hook) to pid {proc.pid}"
    raise InjectionError(f"{kind!r} is not a per-rank fault")


@dataclass
class SlowDown:
    """A straggler made from outside: SIGSTOP/SIGCONT duty cycles on one process.

    Attributes:
        proc: the worker to slow down.
        ratio: the share of each period the worker is stopped (0.5 = half speed).
        duration_s: how long the slow-down lasts.
        period_s: one stop/continue cycle.
    """

    proc: Proc
    ratio: float = 0.5
    duration_s: float = 10.0
    period_s: float = 0.1

    def __post_init__(self) -> None:
        if not 0.0 < self.ratio < 1.0:
            raise InjectionError(f"slow ratio must be in (0, 1), got {self.ratio}")
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sim-slow", daemon=True)

    def start(self) -> None:
        """Begin the duty cycle in a background thread."""
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the duty cycle early; the worker is always left running."""
        self._done.set()
        self._thread.join(timeout)
        if self._thread.is_alive():
            logger.error(
                "slow-down thread for pid %d did not stop in %.0f s", self.proc.pid, timeout
            )

    def _run(self) -> None:
        end = time.monotonic() + self.duration_s
        try:
            while time.monotonic() < end and not self._done.is_set() and still_same(self.proc):
                os.kill(self.proc.pid, signal.SIGSTOP)
                self._done.wait(self.period_s * self.ratio)
                os.kill(self.proc.pid, signal.SIGCONT)
                self._done.wait(self.period_s * (1.0 - self.ratio))
        except ProcessLookupError:
            logger.info("slowed worker pid %d exited", self.proc.pid)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGCONT)


def preempt_node(launcher: Proc, grace_s: float) -> str:
    """Preempt a node like a scheduler: SIGTERM its launcher, SIGKILL its tree after ``grace_s``.

    Returns:
        What happened, for the log.
    """
    tree = [launcher, *descendants(launcher.pid)]
    os.kill(launcher.pid, signal.SIGTERM)
    end = time.monotonic() + grace_s
    while time.monotonic() < end and still_same(launcher):
        time.sleep(0.05)
    killed = kill_all(tree)
    if killed:
        return (
            f"SIGTERM to launcher pid {launcher.pid}; SIGKILL to {killed} process(es) "
            f"still alive after {grace_s:.0f} s"
        )
    return f"SIGTERM to launcher pid {launcher.pid}; all exited within the {grace_s:.0f} s grace"


def lose_node(launcher: Proc, local_dir: Path | None) -> str:
    """A node disappears: SIGKILL its launcher and everything under it; wipe its local storage."""
    killed = kill_all([launcher, *descendants(launcher.pid)])
    wiped = ""
    if local_dir is not None and local_dir.exists():
        shutil.rmtree(local_dir, ignore_errors=True)
        local_dir.mkdir(parents=True, exist_ok=True)
        wiped = f"; wiped {local_dir}"
    return f"SIGKILL to {killed} process(es) of launcher pid {launcher.pid}{wiped}"


def committed_files(root: Path) -> list[Path]:
    """The files of committed checkpoints under ``root`` (none while the job has not saved)."""
    # Hidden names are saves in flight, trash being removed, or disk_full's ballast.
    return [
        p
        for p in root.rglob("*")
        if p.is_file()
        and not p.is_symlink()
        and not any(part.startswith(".") for part in p.relative_to(root).parts)
    ]


def tear_newest_file(root: Path, seed: int) -> str:
    """Tear the newest committed checkpoint file under ``root``: truncate it or flip a byte.

    Which of the two, and which byte, follow from ``seed``. Files under hidden names (a save
    still being written) are left alone.

    Raises:
        InjectionError: no file under ``root``.
    """
    files = committed_files(root)
    if not files:
        raise InjectionError(f"no committed checkpoint file under {root} to tear")
    newest = max(files, key=lambda p: (p.stat().st_mtime_ns, str(p)))
    rng = random.Random(seed)  # noqa: S311 (a reproducible fault, not security)
    size = newest.stat().st_size
    if size > 1 and rng.random() < 0.5:
        with newest.open("r+b") as fh:
            fh.truncate(size // 2)
        return f"truncated {newest} from {size} to {size // 2} bytes"
    if size == 0:
        raise InjectionError(f"newest checkpoint file {newest} is empty; nothing to flip")
    offset = rng.randrange(size)
    with newest.open("r+b") as fh:
        fh.seek(offset)
        byte = fh.read(1)
        fh.seek(offset)
        fh.write(bytes([byte[0] ^ 0xFF]))
    return f"flipped byte {offset} of {newest}"


def fill_disk(root: Path, hold_s: float) -> str:
    """Fill the filesystem holding ``root`` for ``hold_s`` seconds, then free it again.

    Meant for a checkpoint directory on a small dedicated filesystem (``--ckpt-tmpfs``); on a
    large disk it refuses instead of filling it.

    Raises:
        InjectionError: the filesystem is larger than 1 GiB.
    """
    usage = shutil.disk_usage(root)
    if usage.total > 1 << 30:
        raise InjectionError(
            f"{root} is on a {usage.total / 2**30:.0f} GiB filesystem; disk_full only fills a "
            "small dedicated one (use --ckpt-tmpfs SIZE)"
        )
    ballast = root / ".sim-disk-full"
    written = 0
    chunk = b"\0" * (1 << 16)
    try:
        with ballast.open("wb") as fh:
            while True:
                fh.write(chunk)
                fh.flush()
                written += len(chunk)
    except OSError as exc:
        logger.info("disk_full: %s filled after %d bytes (%s)", root, written, exc.strerror)

    def _free() -> None:
        ballast.unlink(missing_ok=True)
        logger.info("disk_full: freed %s after %.0f s", root, hold_s)

    threading.Timer(hold_s, _free).start()
    return f"filled {root} ({written} bytes) for {hold_s:.0f} s"
