"""A rank that cannot be aborted in-process asks ``ft-launcher`` to respawn it alone.

Under ``ft-launcher --ft-inprocess-respawn`` the launcher names a directory in
``UNABORTABLE_DIR_ENV``. Before the monitor thread terminates its own rank (the main thread
stayed stuck past ``hard_timeout`` after the abort), it writes ``UNABORTABLE_FILE`` there: the
launcher then respawns this rank alone, like a SIGKILLed one, and the other ranks wait for it at
the restart barrier instead of going on without it. Without the variable (plain ``torchrun``)
nothing is written and the rank leaves the job, as before.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from resiliency.inprocess._launcher_contract import UNABORTABLE_DIR_ENV, UNABORTABLE_FILE

log = logging.getLogger(__name__)


def respawn_request_path(*, hosting_store: bool) -> Path | None:
    """Where this process asks the launcher for a respawn alone; None when it cannot.

    None without the launcher's directory (plain ``torchrun``) and for the rank that hosts the
    Wrapper's store (its death ends the store; ``request_respawn`` says why).
    """
    directory = os.environ.get(UNABORTABLE_DIR_ENV)
    if not directory or hosting_store:
        return None
    return Path(directory) / UNABORTABLE_FILE.format(pid=os.getpid())


def request_respawn(reason: str, *, hosting_store: bool) -> bool:
    """Tell the launcher that this process terminates itself and should be respawned alone.

    Args:
        reason: why the rank could not be aborted (logged by the launcher).
        hosting_store: this rank hosts the Wrapper's store, which dies with it: a respawn
            would find no running job to join, so none is asked for.

    Returns:
        True when the request was written (the caller must then not report the rank gone);
        False without the launcher's directory, or when it could not be written (the caller
        then reports the rank gone, as under plain torchrun).
    """
    directory = os.environ.get(UNABORTABLE_DIR_ENV)
    if not directory:
        return False
    if hosting_store:
        log.error(
            "this rank hosts the in-process restart store, which ends with it: it cannot be "
            "respawned alone (pass a store_factory whose store lives elsewhere); it leaves the "
            "job and the launcher restarts the whole group"
        )
        return False
    path = respawn_request_path(hosting_store=False)
    assert path is not None  # the directory is set
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(reason)
        os.replace(tmp, path)  # whole or absent: the launcher may read it at any moment
    except OSError as exc:
        log.error(
            "could not ask the launcher to respawn this rank (%s): %s; it leaves the job instead",
            path,
            exc,
        )
        return False
    return True
