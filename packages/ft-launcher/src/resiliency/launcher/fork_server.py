"""Workers forked from a process that has already imported their heavy modules.

Every restart of a Python training job starts its workers from nothing: each imports torch,
Lightning and the rest again (seconds of CPU per worker, all at once on every node). With
``--ft-preimport torch,lightning`` ft-launcher starts one fork server per node at launch
(``_fork_server_main``), which imports those modules once; every worker of every restart is
then forked from it (``_forked_worker``) instead of started by ``subprocess.Popen``. The
worker is otherwise the same process torch's launcher would start: same command line, the
same environment, its own session, stdout/stderr where torch redirects them.

torch's agent keeps its own bookkeeping: ``ForkedHandler`` stands in for torch's
``SubprocessHandler`` (``_torch_compat.worker_handler_factory``) and ``ForkedProc`` for its
``Popen``. A worker that the server cannot fork (another interpreter, unsupported Python
options) is started the usual way, with a warning.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from resiliency.launcher._contracts import FORKED_ENVIRON_DIR_ENV
from resiliency.launcher._frames import recv_frame, send_frame
from resiliency.launcher.errors import ForkServerError

__all__ = ["ForkServer", "ForkedHandler", "ForkedProc"]

logger = logging.getLogger(__name__)

READY_TIMEOUT_S = 300.0  # importing torch and Lightning on a loaded node can take a minute
_REPLY_TIMEOUT_S = 30.0


class ForkedProc:
    """The part of ``subprocess.Popen`` torch's agent uses, for a worker of the fork server."""

    def __init__(self, server: ForkServer, pid: int) -> None:
        self._server = server
        self.pid = pid
        self.args = ()

    @property
    def returncode(self) -> int | None:
        return self.poll()

    def poll(self) -> int | None:
        """The exit code once the worker has ended, else None."""
        return self._server.exit_code(self.pid)

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the worker to end.

        Raises:
            subprocess.TimeoutExpired: it is still running after ``timeout`` seconds.
        """
        code = self._server.wait_exit(self.pid, timeout)
        if code is None:
            raise subprocess.TimeoutExpired(f"worker pid {self.pid}", timeout or 0.0)
        return code

    def send_signal(self, sig: int) -> None:
        """Send ``sig`` to the worker (if it is still running)."""
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        """SIGKILL the worker."""
        self.send_signal(signal.SIGKILL)


class ForkedHandler:
    """Stands in for torch's ``SubprocessHandler`` (same attributes, same ``close``)."""

    def __init__(  # noqa: PLR0917 (torch's SubprocessHandler's parameters)
        self,
        server: ForkServer,
        entrypoint: str,
        args: tuple[Any, ...],
        env: dict[str, str],
        stdout: str | None,
        stderr: str | None,
        local_rank_id: int,
    ) -> None:
        self.local_rank_id = local_rank_id
        full_env = {**os.environ, **env}
        self.proc = server.spawn([entrypoint, *map(str, args)], full_env, stdout, stderr)

    def close(self, death_sig: signal.Signals | None = None) -> None:
        """Signal the worker's process group, as torch's handler does."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # ended since the poll
                os.killpg(self.proc.pid, death_sig or signal.SIGTERM)


class ForkServer:
    """One fork server per launcher; thread-safe.

    Args:
        modules: what the server imports before it forks anything.
        wait: wait here until the server has imported them (``wait_ready``); False starts it
            and returns at once, so that the launcher's own imports run while it imports.
    """

    def __init__(self, modules: list[str], *, wait: bool = True) -> None:
        self.modules = modules
        self._lock = threading.Lock()
        self._exited = threading.Condition(self._lock)
        self._exits: dict[int, int] = {}
        self._replies: list[dict[str, Any]] = []
        self._alive = False
        self._ready = False
        self._sock, theirs = socket.socketpair()
        # Where forked workers publish their environment for tools outside the job.
        self.environ_dir = tempfile.mkdtemp(prefix="ft-forked-environ-")
        self._started = time.monotonic()
        try:
            self._proc = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "resiliency.launcher._fork_server_main",
                    str(theirs.fileno()),
                    ",".join(modules),
                ],
                pass_fds=(theirs.fileno(),),
                env={**os.environ, FORKED_ENVIRON_DIR_ENV: self.environ_dir},
            )
        except OSError as exc:
            self._sock.close()
            shutil.rmtree(self.environ_dir, ignore_errors=True)
            raise ForkServerError(f"cannot start the fork server: {exc}") from exc
        finally:
            theirs.close()
        if wait:
            self.wait_ready()

    def wait_ready(self) -> None:
        """Wait until the server has imported its modules (at most ``READY_TIMEOUT_S``).

        Raises:
            ForkServerError: it exited, or did not get ready in time (it is closed then).
        """
        if self._ready:
            return
        modules = ", ".join(self.modules)
        self._sock.settimeout(max(0.0, self._started + READY_TIMEOUT_S - time.monotonic()))
        try:
            ready = recv_frame(self._sock)
        except (OSError, ValueError) as exc:
            self.close()
            raise ForkServerError(
                f"the fork server did not get ready in {READY_TIMEOUT_S:.0f} s importing "
                f"{modules}: {exc}"
            ) from exc
        if ready is None or ready.get("t") != "ready":
            code = self._proc.wait()
            self.close()
            raise ForkServerError(
                f"the fork server exited ({code}) importing {modules}; see its error above"
            )
        self._sock.settimeout(None)
        self._ready = self._alive = True
        self._reader = threading.Thread(target=self._read, name="ft-fork-server", daemon=True)
        self._reader.start()
        logger.info(
            "fork server pid %d ready %.1f s after its start (preimported %s)",
            self._proc.pid,
            time.monotonic() - self._started,
            modules,
        )

    @property
    def pid(self) -> int:
        """The fork server's pid."""
        return int(self._proc.pid)

    def _read(self) -> None:
        try:
            while True:
                message = recv_frame(self._sock)
                if message is None:
                    break
                with self._lock:
                    if message.get("t") == "exit":
                        self._exits[int(message["pid"])] = int(message["code"])
                    else:
                        self._replies.append(message)
                    self._exited.notify_all()
        except (OSError, ValueError) as exc:
            logger.error("fork server connection failed: %s", exc)
        with self._lock:
            self._alive = False
            self._exited.notify_all()

    def spawn(
        self, argv: list[str], env: dict[str, str], stdout: str | None, stderr: str | None
    ) -> ForkedProc | subprocess.Popen[bytes]:
        """Start one worker; a Popen when the server cannot fork this command."""
        request = {
            "t": "spawn",
            "argv": argv,
            "env": env,
            "cwd": os.getcwd(),
            "stdout": stdout,
            "stderr": stderr,
        }
        with self._lock:
            if not self._alive:
                raise ForkServerError("the fork server is gone; the launcher must restart")
            send_frame(self._sock, request)
            deadline = time.monotonic() + _REPLY_TIMEOUT_S
            while not self._replies:
                left = deadline - time.monotonic()
                if left <= 0 or not self._alive:
                    raise ForkServerError(
                        f"the fork server did not answer a spawn in {_REPLY_TIMEOUT_S:.0f} s"
                    )
                self._exited.wait(left)
            reply = self._replies.pop(0)
            if reply.get("t") == "spawned":
                # A reused pid: the old process's exit was reported (and reaped) before the
                # kernel could hand its pid out again, so an entry here is stale.
                self._exits.pop(int(reply["pid"]), None)
        if reply.get("t") == "spawned":
            return ForkedProc(self, int(reply["pid"]))
        logger.warning("fork server: %s; starting the worker as a new process", reply.get("why"))
        return _popen(argv, env, stdout, stderr)

    def make_handler(
        self,
        *,
        entrypoint: str,
        args: tuple[Any, ...],
        env: dict[str, str],
        stdout: str | None,
        stderr: str | None,
        local_rank_id: int,
        numa_options: Any = None,
        **unknown: Any,
    ) -> Any:
        """torch's ``get_subprocess_handler``, forking from this server when it can."""
        if numa_options is not None or unknown:
            # NUMA binding wraps the command in numactl: only a new process can have it.
            from torch.distributed.elastic.multiprocessing.subprocess_handler import (  # noqa: PLC0415
                SubprocessHandler,
            )

            return SubprocessHandler(
                entrypoint=entrypoint,
                args=args,
                env=env,
                stdout=stdout,
                stderr=stderr,
                local_rank_id=local_rank_id,
                numa_options=numa_options,
                **unknown,
            )
        return ForkedHandler(self, entrypoint, args, env, stdout, stderr, local_rank_id)

    def exit_code(self, pid: int) -> int | None:
        """The exit code of a worker, once the server reported it."""
        with self._lock:
            return self._lost(pid)

    def wait_exit(self, pid: int, timeout: float | None) -> int | None:
        """Wait up to ``timeout`` seconds for a worker to end; its code, else None."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while (code := self._lost(pid)) is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self._exited.wait(left if left is not None else 1.0)
            return code

    def _lost(self, pid: int) -> int | None:
        code = self._exits.get(pid)
        if code is None and not self._alive and not _exists(pid):
            return -int(signal.SIGKILL)  # the server died with it: its status is lost
        return code

    def close(self) -> None:
        """Stop the server (its workers are the agent's to stop)."""
        # shutdown, not only close: the reader thread is blocked in recv on this socket, which
        # keeps it open in the kernel, so the server would never see the end of the stream.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
        if not self._ready and self._proc.poll() is None:
            self._proc.kill()  # still importing, nothing forked yet: no need to wait for it
        try:
            self._proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()
        shutil.rmtree(self.environ_dir, ignore_errors=True)


def _exists(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie nobody reaps, once its server died, has ended)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2 :][:1] not in ("Z", "X")


def _popen(
    argv: list[str], env: dict[str, str], stdout: str | None, stderr: str | None
) -> subprocess.Popen[bytes]:
    out = open(stdout, "w") if stdout else None  # noqa: SIM115 (the child holds them)
    err = open(stderr, "w") if stderr else None  # noqa: SIM115
    try:
        return subprocess.Popen(argv, env=env, stdout=out, stderr=err, start_new_session=True)
    finally:
        for f in (out, err):
            if f is not None:
                f.close()
