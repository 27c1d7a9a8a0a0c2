"""Where the nodes of a round exchange their failure and hang evidence.

Without a supervisor that is the round's store (a TCPStore, hosted by node 0's launcher under
the c10d rendezvous). With ``--supervisor URL`` it is the supervisor's backend (etcd, or the
TCPStore the URL names): the job's state then lives where the supervisor's does, outside any one
training node. Each round gets its own key prefix there, ``<job>/verdicts/<round id>/``: node 0
draws the round id and hands it to the others through the round's store (one write, one read per
node and round, never per failure), so a late node of an earlier round can never mix its
evidence into a later round's verdict.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from torch.distributed import Store

from resiliency.launcher._backend_store import BackendStore
from resiliency.launcher._shared_state import ExchangeStore, StoreWaitTimeoutError, wait_keys

__all__ = ["VERDICTS_PREFIX", "exchange_store_for"]

logger = logging.getLogger(__name__)

#: Below the supervisor's job namespace: ``verdicts/<round id>/`` + the exchanges' keys.
VERDICTS_PREFIX = "verdicts/"
_ROUND_ID = "ft/exchange_round_id"  # in the round's store: node 0's id for this round
#: How long a node waits for node 0's round id (node 0 writes it right after the rendezvous).
_ROUND_ID_WAIT_S = 60.0


def exchange_store_for(round_store: Store, rank: int, backend: Any | None) -> ExchangeStore:
    """The store this node's job-wide exchanges use in the new round.

    Args:
        round_store: the round's store.
        rank: this node's group rank.
        backend: the supervisor's backend (``Supervision.exchange_backend``), or None.

    Returns:
        A :class:`BackendStore` under this round's prefix of the backend; the round's store
        when there is no backend, or when node 0's round id cannot be agreed on (logged: the
        verdicts are then exchanged as without a supervisor).
    """
    if backend is None:
        return round_store
    try:
        if rank == 0:
            round_id = uuid.uuid4().hex
            round_store.set(_ROUND_ID, round_id)
        else:
            wait_keys(round_store, [_ROUND_ID], _ROUND_ID_WAIT_S, "node 0's exchange round id")
            round_id = round_store.get(_ROUND_ID).decode()
    except (RuntimeError, StoreWaitTimeoutError) as exc:
        logger.error(
            "node %d: cannot agree on this round's key prefix in the supervisor's backend (%s); "
            "exchanging the failure verdicts through the round's store instead",
            rank,
            exc,
        )
        return round_store
    logger.info(
        "node %d: job-wide verdicts exchanged in %s under %s%s/",
        rank,
        getattr(backend, "url", backend),
        VERDICTS_PREFIX,
        round_id,
    )
    return BackendStore(backend, prefix=f"{VERDICTS_PREFIX}{round_id}/")
