"""The rendezvous store's host is gone: this node cannot go on, and says so before it leaves.

Under the c10d rendezvous one launcher hosts the job's TCPStore (the ``--rdzv-endpoint`` node).
When that node is lost (its launcher killed with its process group, the machine gone), every
other launcher's next call into the rendezvous fails: torch's ``num_nodes_waiting``, which the
loop asks every monitoring interval, raises ``RendezvousConnectionError``. Before, that error
ended the launcher with a traceback and no verdict; now the loop closes the cycle as a
``node_lost`` verdict (the lost node is the culprit) and this node stops with a message that says
what to do.
"""

from __future__ import annotations

from torch.distributed.elastic.agent.server.api import WorkerGroup
from torch.distributed.elastic.rendezvous import RendezvousConnectionError

from resiliency.launcher._agent_settings import Outcome
from resiliency.launcher._node_leaves import NodeLeaves
from resiliency.launcher.exit_codes import ExitCode

__all__ = ["STORE_HOST_LOST", "nodes_waiting"]

#: The outcome's reason (``--exit-status-file``) when the rendezvous store's host is gone.
STORE_HOST_LOST = "store_host_lost"

_WHAT_TO_DO = (
    "a job under the c10d rendezvous cannot go on without the node that hosts its store; "
    "requeue the job, and to outlive the loss of any one node run the rendezvous on etcd "
    "(--rdzv-backend etcd-v2 --rdzv-endpoint HOST:2379) or under the job's supervisor "
    "(--supervisor etcd://...)"
)


def nodes_waiting(group: WorkerGroup) -> int:
    """Ask the rendezvous how many nodes wait to join; a gone store host makes this node leave.

    Args:
        group: this node's worker group (its rendezvous handler, group rank and round size).

    Returns:
        The number of nodes waiting.

    Raises:
        NodeLeaves: the rendezvous store cannot be reached (its host is gone); the outcome is a
            failure (exit 1, ``store_host_lost``) and ``store_lost`` names the lost node.
    """
    try:
        return group.spec.rdzv_handler.num_nodes_waiting()
    except RendezvousConnectionError as exc:
        # With two nodes the lost host is the other one; with more, this node cannot tell which.
        group_rank = group.group_rank or 0
        others = tuple(n for n in range(group.group_world_size or 1) if n != group_rank)
        lost = others if len(others) == 1 else ()
        who = f"node {lost[0]}" if lost else "the node that hosts it"
        detail = (
            f"the rendezvous store is unreachable from node {group_rank} ({exc}): {who} is "
            f"gone; {_WHAT_TO_DO}"
        )
        raise NodeLeaves(Outcome(ExitCode.FAILURE, STORE_HOST_LOST, detail), lost=lost) from exc
