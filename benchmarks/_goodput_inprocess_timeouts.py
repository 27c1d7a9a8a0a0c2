"""Calculated heartbeat timeouts for the in-process goodput job, as the toolkit's Lightning
callback (``FaultToleranceCallback(calculate_timeouts=True)``) does them for setup 2.

Once the job has restarted (the agreed step of a fresh start is past 0, or the Wrapper restarted
in-process), every rank calculates its heartbeat timeouts from the longest gaps all ranks'
monitors observed (the client's ``calculate_and_set_hb_timeouts``, a collective: every rank
calls it at the same step), once per wrapper iteration, at its first checkpoint save: the gaps
then include a restart and a save. Rank 0 keeps the result in a state file that every new
process loads at its start, so a full restart keeps the calculated timeouts.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from resiliency.ft import RankMonitorClient

logger = logging.getLogger(__name__)


class CalculatedTimeouts:
    """When to calculate, and the state file that carries the result across restarts.

    Args:
        client: this rank's connected monitor client.
        state_file: the JSON file rank 0 writes and every process reads at its start.
    """

    def __init__(self, client: RankMonitorClient, state_file: Path) -> None:
        self.client = client
        self.state_file = state_file
        self._pending = False
        try:
            state = json.loads(state_file.read_text())
        except FileNotFoundError:
            return
        except (OSError, ValueError) as exc:
            logger.warning("ignoring calculated timeouts in %s (%s)", state_file, exc)
            return
        client.load_state_dict(state)
        logger.info("loaded calculated timeouts from %s", state_file)

    def started(self, iteration: int, step: int) -> None:
        """A wrapper iteration starts at ``step`` (the same on every rank, after the heal)."""
        self._pending = iteration > 0 or step > 0

    def at_save(self, rank: int) -> None:
        """Calculate now if due (every rank reaches the same save step of an iteration)."""
        if not self._pending:
            return
        self._pending = False
        if not self.client.calculate_and_set_hb_timeouts():
            return
        if rank == 0:
            tmp = self.state_file.with_suffix(".tmp")
            try:
                self.state_file.parent.mkdir(parents=True, exist_ok=True)
                tmp.write_text(json.dumps(self.client.state_dict()))
                os.replace(tmp, self.state_file)
            except OSError as exc:
                logger.warning("cannot keep calculated timeouts in %s (%s)", self.state_file, exc)
