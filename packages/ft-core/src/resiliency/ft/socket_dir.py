"""Where the monitor sockets live, and who may talk to them.

Each job gets a private directory (mode 0700, owned by the job's user) holding one socket per local
rank, ``rank-<local_rank>.sock``, and the stack-dump files. The monitor also checks every peer's
kernel-reported credentials (``SO_PEERCRED``): same uid, and for a rank, the worker process it was
told about or one of its descendants (see :mod:`resiliency.ft._proc`).
"""

from __future__ import annotations

import os
import socket
import stat
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path

from resiliency.ft.errors import ConfigError

__all__ = [
    "MAX_SOCKET_PATH_BYTES",
    "PeerCredentials",
    "check_socket_path",
    "create_socket_dir",
    "ensure_private_dir",
    "peer_credentials",
    "socket_path_for",
    "stack_dump_path_for",
]

#: sockaddr_un.sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107


@dataclass(frozen=True)
class PeerCredentials:
    """The credentials the kernel recorded for the process that connected.

    Attributes:
        pid: The peer's process id (at connect time).
        uid: The peer's effective user id.
        gid: The peer's effective group id.
    """

    pid: int
    uid: int
    gid: int


def create_socket_dir(prefix: str = "ft-", base_dir: str | os.PathLike[str] | None = None) -> Path:
    """Create a fresh private directory for one job's monitor sockets.

    Args:
        prefix: Name prefix of the directory.
        base_dir: Where to create it; ``$TMPDIR`` (or the system's temporary directory) if None.

    Returns:
        The directory (mode 0700).
    """
    # mkdtemp creates the directory with mode 0700 and an unpredictable name.
    return Path(tempfile.mkdtemp(prefix=prefix, dir=base_dir))


def ensure_private_dir(directory: str | os.PathLike[str]) -> Path:
    """Create ``directory`` with mode 0700, or check that an existing one is private.

    Args:
        directory: The socket directory.

    Returns:
        The directory as a Path.

    Raises:
        ConfigError: The directory exists but another user owns it or others may enter it.
    """
    path = Path(directory)
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = path.stat()
    if st.st_uid != os.geteuid():
        raise ConfigError(
            f"socket directory {path} is owned by uid {st.st_uid}, not by this user "
            f"({os.geteuid()}); use a directory of your own (e.g. a fresh tempfile.mkdtemp())"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        raise ConfigError(
            f"socket directory {path} has mode {stat.S_IMODE(st.st_mode):04o}; it must not be "
            f"accessible to other users: chmod 700 {path} or use a fresh directory"
        )
    return path


def check_socket_path(path: str | os.PathLike[str]) -> str:
    """Check that a socket path fits in ``sockaddr_un``.

    Args:
        path: The socket path.

    Returns:
        The path as a string.

    Raises:
        ConfigError: The path is longer than :data:`MAX_SOCKET_PATH_BYTES` bytes.
    """
    text = os.fspath(path)
    size = len(os.fsencode(text))
    if size > MAX_SOCKET_PATH_BYTES:
        raise ConfigError(
            f"socket path {text!r} is {size} bytes; Unix sockets allow at most "
            f"{MAX_SOCKET_PATH_BYTES}. Set TMPDIR to a shorter directory (e.g. TMPDIR=/tmp)."
        )
    return text


def socket_path_for(directory: str | os.PathLike[str], local_rank: int) -> Path:
    """Return the monitor socket path of one local rank inside a job's socket directory.

    Args:
        directory: The job's socket directory.
        local_rank: The local rank.

    Returns:
        ``<directory>/rank-<local_rank>.sock``.

    Raises:
        ConfigError: The resulting path is too long for a Unix socket.
    """
    path = Path(directory) / f"rank-{local_rank}.sock"
    check_socket_path(path)
    return path


def stack_dump_path_for(socket_path: str | os.PathLike[str], local_rank: int) -> Path:
    """Return the file a rank's stack dump is written to, next to its monitor socket.

    Args:
        socket_path: The monitor's socket path.
        local_rank: The local rank.

    Returns:
        ``<socket directory>/rank-<local_rank>-stacks.txt``.
    """
    return Path(socket_path).parent / f"rank-{local_rank}-stacks.txt"


#: The monitor's one-byte termination mark, next to its socket (``{local_rank}`` filled in): 1 from
#: just before the monitor sends its rank the termination signal for a hang until the rank is
#: gone, else 0. A rank's emergency checkpoint reads it to tell that signal from a preemption
#: (resiliency.checkpoint keeps its copy; tests/integration/test_contracts.py holds both).
TERMINATION_MARK_NAME = "rank-{local_rank}-terminating"


def termination_mark_path_for(socket_path: str | os.PathLike[str], local_rank: int) -> Path:
    """Return the monitor's termination mark of a rank, next to its monitor socket.

    Args:
        socket_path: The monitor's socket path.
        local_rank: The local rank.

    Returns:
        ``<socket directory>/rank-<local_rank>-terminating``.
    """
    return Path(socket_path).parent / TERMINATION_MARK_NAME.format(local_rank=local_rank)


def peer_credentials(sock: socket.socket) -> PeerCredentials:
    """Read the connected peer's credentials with ``SO_PEERCRED``.

    Args:
        sock: A connected AF_UNIX socket.

    Returns:
        The peer's pid, uid and gid.
    """
    fmt = "3i"
    raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize(fmt))
    pid, uid, gid = struct.unpack(fmt, raw)
    return PeerCredentials(pid=pid, uid=uid, gid=gid)
