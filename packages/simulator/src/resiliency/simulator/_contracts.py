"""What the simulator agrees on with packages it may not import, each spelled here once.

The simulator depends on goodput only; it drives ft-launcher and ft-core's in-rank hook from
outside, through the environment and signals. The other side of each agreement keeps its own
copy, and tests/integration/test_contracts.py checks that both are the same.
"""

from __future__ import annotations

#: ft-core's fault hook (``resiliency.ft.FAULT_HOOK_ENV``): set to 1, a rank's client installs
#: the handlers of the injected faults.
HOOK_ENV = "RESILIENCY_FAULT_HOOK"
#: The real-time signals of the hook, by fault kind, as offsets from SIGRTMIN
#: (``resiliency.ft.FAULT_HOOK_SIGNALS``).
HOOK_SIGNALS = {"hang": 1, "hang_nogil": 2, "crash": 3}
#: ft-launcher's fork server sets this in its environment, which its forked workers show in
#: ``/proc/<pid>/environ``; each worker publishes its own environment as ``<dir>/<pid>``
#: (the launcher's ``_forked_worker.ENVIRON_DIR_VAR``).
FORKED_ENVIRON_DIR_VAR = "RESILIENCY_FORKED_ENVIRON_DIR"
#: The simulated node a launcher runs as (0, 1, ...), for the job's own scripts and logs.
SIM_NODE_ENV = "RESILIENCY_SIM_NODE"
