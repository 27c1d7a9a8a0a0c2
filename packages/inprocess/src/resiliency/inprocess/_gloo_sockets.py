"""Shut down the TCP sockets a gloo process group opened, to end its pending collectives.

On gloo, ``ProcessGroup.abort()`` and ``destroy_process_group()`` return at once but leave a
pending collective waiting (measured with torch 2.13: the wait ended only when the peer process
exited). Shutting down the group's sockets ends it in milliseconds, on this rank and on every
peer connected to it: gloo reports "Connection closed by peer". The wrapper takes a snapshot of
the process's sockets before each call of the wrapped function; what is new at abort time and
is not a connection to the wrapper's own store is the function's: gloo's pairs, and the store
client a pending ``init_process_group`` waits on (a store wait is not interruptible either).
"""

from __future__ import annotations

import logging
import os
import socket
import stat

log = logging.getLogger(__name__)

_FD_DIR = "/proc/self/fd"


def _socket_inode(fd: int) -> int | None:
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    return info.st_ino if stat.S_ISSOCK(info.st_mode) else None


def snapshot() -> frozenset[tuple[int, int]]:
    """Return the (fd, inode) pairs of this process's open sockets."""
    try:
        names = os.listdir(_FD_DIR)
    except OSError:
        return frozenset()
    found = set()
    for name in names:
        inode = _socket_inode(int(name))
        if inode is not None:
            found.add((int(name), inode))
    return frozenset(found)


def shutdown_new_tcp(baseline: frozenset[tuple[int, int]], store_ports: set[int]) -> int:
    """Shut down connected TCP sockets opened since ``baseline``, except store connections.

    Args:
        baseline: ``snapshot()`` taken before the wrapped function started.
        store_ports: ports of the wrapper's own store; a socket with one of them at either end
            is kept.

    Returns:
        How many sockets were shut down.
    """
    count = 0
    for fd, inode in sorted(snapshot() - baseline):
        try:
            sock = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue  # closed meanwhile
        try:
            if sock.type != socket.SOCK_STREAM or sock.family not in (
                socket.AF_INET,
                socket.AF_INET6,
            ):
                continue
            try:
                local_port = sock.getsockname()[1]
                peer_port = sock.getpeername()[1]
            except OSError:
                continue  # a listener or an unconnected socket: no pending transfer
            if local_port in store_ports or peer_port in store_ports:
                continue
            try:
                sock.shutdown(socket.SHUT_RDWR)
                count += 1
            except OSError as exc:
                log.debug("socket fd %d (inode %d): shutdown failed: %s", fd, inode, exc)
        finally:
            sock.close()  # closes the duplicate only
    return count
