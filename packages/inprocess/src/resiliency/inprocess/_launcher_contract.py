"""What the Wrapper agrees on with ``ft-launcher --ft-inprocess-respawn`` (which it may not
import): this side's copy. The launcher's is ``resiliency.launcher._contracts``;
tests/integration/test_contracts.py holds the two against each other.
"""

from __future__ import annotations

#: Set only in the environment of a worker the launcher respawned alone: the Wrapper joins the
#: running job's restart barrier instead of starting a new job, and once it has passed it as a
#: member, writes its pid to this file (how the launcher knows the respawned rank joined).
REJOIN_FILE_ENV = "RESILIENCY_INPROCESS_REJOIN_FILE"
