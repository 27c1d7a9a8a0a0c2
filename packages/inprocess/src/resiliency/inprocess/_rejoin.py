"""A respawned process joins the running job (``ft-launcher --ft-inprocess-respawn``, or a
replacement forked by ``auto_restart.monitor_and_restart``).

The launcher (or the supervisor) respawns a dead rank alone, with its old rank and environment
plus ``REJOIN_FILE_ENV``. Its Wrapper does not start a new job: it reads the job's newest iteration
from the store, takes the place its dead predecessor had there (the members, its rank), reports
a ``respawn`` fault in that iteration (so every survivor restarts, even one that had not yet
noticed the death) and enters that iteration's restart barrier like any survivor. After the
barrier it goes on exactly as the survivors do; once it is a member it writes its pid to the
file, which tells the launcher it joined.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from resiliency.inprocess._launcher_contract import REFUSED_SUFFIX, REJOIN_FILE_ENV
from resiliency.inprocess._restart_store import RestartStore
from resiliency.inprocess.rank_assignment import RankDiscarded
from resiliency.inprocess.state import Mode, State

log = logging.getLogger(__name__)


def joining(store: RestartStore) -> int | None:
    """The running job's iteration this process joins; None for an ordinary start.

    Only a process the launcher respawned joins, and only a job that already called the
    function (a rank that died before the first call is simply started again).
    """
    if not os.environ.get(REJOIN_FILE_ENV):
        return None
    return store.current()


def take_place(store: RestartStore, state: State, iteration: int) -> list[int]:
    """Become the dead predecessor in ``iteration`` and report the respawn there.

    Returns:
        The initial ranks that are members of ``iteration`` (the restart barrier's members).

    Raises:
        RankDiscarded: the others already declared this rank gone (it was respawned too late,
            after ``heartbeat_timeout``), so there is no place to take.
    """
    me = state.initial_rank
    members = store.decided(iteration - 1) if iteration > 0 else None
    if members is None:
        members = list(range(state.initial_world_size))
    if me in store.terminated() or me not in members:
        raise RankDiscarded(
            f"initial rank {me} was respawned (pid {os.getpid()}) but the other ranks had "
            f"already declared it gone: {store.termination_reason(me)}; a respawn must reach "
            "the job within the Wrapper's heartbeat_timeout"
        )
    rank = store.rank_in(iteration, me)
    state.rank = members.index(me) if rank is None else rank
    state.world_size = state.active_world_size = len(members)
    state.active_rank = state.rank
    state.mode = Mode.ACTIVE  # as its predecessor was: not INITIALIZED, the first call's mode
    state.iteration = iteration
    store.report_fault(
        iteration,
        me,
        {
            "kind": "respawn",
            "reason": f"its process died and was respawned as pid {os.getpid()}",
        },
    )
    log.warning(
        "rank %d (initial %d): respawned as pid %d; joining the running job at its restart "
        "barrier of iteration %d (members %s)",
        state.rank,
        me,
        os.getpid(),
        iteration,
        members,
    )
    return members


def refuse(exc: BaseException) -> None:
    """If this is a respawned process that has not joined yet, record why it could not."""
    path = os.environ.get(REJOIN_FILE_ENV)
    if not path:
        return
    refused = Path(path + REFUSED_SUFFIX)
    try:
        refused.write_text(f"{type(exc).__name__}: {exc}")
    except OSError as err:
        log.error("could not record that this respawned rank was refused (%s): %s", refused, err)


def announce() -> None:
    """Tell the launcher this process joined: its pid in the agreed file (written atomically)."""
    path = Path(os.environ.pop(REJOIN_FILE_ENV))  # the next restart here is an ordinary one
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(str(os.getpid()))
        os.replace(tmp, path)
    except OSError as exc:
        # The launcher then takes this rank for one that never joined, and restarts the group.
        log.error("could not tell the launcher that this respawned rank joined (%s): %s", path, exc)
