"""What ft-launcher agrees on with processes of packages it may not import, spelled here once.

The workers' code (resiliency-checkpoint's emergency save, resiliency-ptl's auto-resume,
resiliency-inprocess's Wrapper), the simulator that drives the launcher from outside, and the
supervisor (an optional extra) each keep their own copy of their side;
tests/integration/test_contracts.py checks every pair, and docs/environment.md lists every
variable with who sets and who reads it.
"""

from __future__ import annotations

# --- with resiliency-checkpoint's emergency save (graceful preemption) ---------------------
#: The code a rank exits with after its emergency save (``PREEMPTED_EXIT_CODE``).
PREEMPTED_EXIT_CODE_ENV = "RESILIENCY_PREEMPTED_EXIT_CODE"
#: The launcher's private directory: each rank writes ``rank_<RANK>.json`` (its saved step)
#: there, and the launcher keeps the stop mark there.
EXIT_INFO_DIR_ENV = "RESILIENCY_EXIT_INFO_DIR"
#: Seconds between the SIGTERM the launcher forwards and its SIGKILL.
TERM_TIMEOUT_ENV = "RESILIENCY_TERM_TIMEOUT_S"
#: One byte in the exit-info directory that the ranks map: 1 while the launcher itself stops
#: them (a restart, a failure), so their SIGTERM handler tells that from a preemption.
STOP_MARK_FILE = "launcher_stopping"

# --- with resiliency-ptl's auto-resume ------------------------------------------------------
#: The file the training script creates when training is complete: no restart after it.
FINISHED_FLAG_ENV = "FAULT_TOL_FINISHED_FLAG_FILE"

# --- with the simulator, which finds forked workers in /proc --------------------------------
#: Set in the fork server's environment: the directory where each forked worker publishes its
#: own environment as ``<pid>`` (``KEY=VALUE`` entries, each ending in a NUL byte).
FORKED_ENVIRON_DIR_ENV = "RESILIENCY_FORKED_ENVIRON_DIR"

# --- with resiliency-inprocess's Wrapper (--ft-inprocess-respawn) -------------------------
#: Set only in the environment of a worker the launcher respawned alone: its Wrapper joins the
#: running job's restart barrier instead of starting a new job, and once it has passed it as a
#: member, writes its pid to this file (how the launcher knows the respawned rank joined).
INPROCESS_REJOIN_FILE_ENV = "RESILIENCY_INPROCESS_REJOIN_FILE"
#: Set in every worker's environment under --ft-inprocess-respawn: a directory where a Wrapper
#: that could not abort its rank in-process writes ``INPROCESS_UNABORTABLE_FILE`` (named by its
#: pid) just before it terminates itself. Only a SIGTERM or SIGKILL death with this file for the
#: dead pid is respawned alone; any other SIGTERM (the scheduler's, the user's) is not.
INPROCESS_UNABORTABLE_DIR_ENV = "RESILIENCY_INPROCESS_UNABORTABLE_DIR"
#: The file's name in that directory; its content is the Wrapper's reason.
INPROCESS_UNABORTABLE_FILE = "unabortable-{pid}"
#: Set in every worker's environment under --ft-inprocess-respawn: the port of the TCPStore the
#: launcher of node 0 hosts for the Wrapper (at ``MASTER_ADDR``) for the whole rendezvous round,
#: instead of rank 0 at ``MASTER_PORT + 1``: the store then outlives any rank, so rank 0 too
#: can be respawned alone.
INPROCESS_STORE_PORT_ENV = "RESILIENCY_INPROCESS_STORE_PORT"

# --- with resiliency-supervisor (an extra) --------------------------------------------------
#: This node's id for the supervisor when ``--node-id`` is not given (else the host name).
NODE_ID_ENV = "RESILIENCY_NODE_ID"
