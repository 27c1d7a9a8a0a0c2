"""What the Wrapper agrees on with ``ft-launcher --ft-inprocess-respawn`` (which it may not
import): this side's copy. The launcher's is ``resiliency.launcher._contracts``;
tests/integration/test_contracts.py holds the two against each other.
"""

from __future__ import annotations

#: Set only in the environment of a worker the launcher respawned alone (or of a replacement that
#: ``auto_restart.monitor_and_restart`` forked): the Wrapper joins the running job's restart
#: barrier instead of starting a new job, and once it has passed it as a member, writes its pid
#: to this file (how the launcher knows the respawned rank joined).
REJOIN_FILE_ENV = "RESILIENCY_INPROCESS_REJOIN_FILE"

#: Set in every worker's environment under ``--ft-inprocess-respawn``: a directory where a
#: Wrapper that could not abort its rank in-process writes ``UNABORTABLE_FILE`` (named by its
#: own pid) just before it terminates itself. A worker that then dies of SIGTERM or SIGKILL is
#: respawned alone only when this file names its pid: any other SIGTERM (the scheduler's, the
#: user's) is a request to stop and is never respawned.
UNABORTABLE_DIR_ENV = "RESILIENCY_INPROCESS_UNABORTABLE_DIR"
#: The file's name in that directory; its content is the reason, for the launcher's log.
UNABORTABLE_FILE = "unabortable-{pid}"
#: Set in every worker's environment under ``--ft-inprocess-respawn``: the port of the store the
#: launcher of node 0 hosts at ``MASTER_ADDR`` for the Wrapper (its default store connects there
#: instead of rank 0 hosting one at ``MASTER_PORT + 1``), so the store outlives every rank.
STORE_PORT_ENV = "RESILIENCY_INPROCESS_STORE_PORT"
#: A respawned process whose Wrapper could not join the running job (its rank was declared gone,
#: the job's store is unreachable, the job has ended) writes the reason to the rejoin file's
#: path plus this suffix before its exception propagates. ``auto_restart.monitor_and_restart``
#: then stops forking replacements: the next one would be refused the same way. (ft-launcher
#: judges such a worker by its exit, and falls back to a full restart.)
REFUSED_SUFFIX = ".refused"
