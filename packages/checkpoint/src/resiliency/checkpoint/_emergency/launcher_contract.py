"""What a rank and ft-launcher agree on for graceful preemption, through the environment only.

Neither side imports the other: ft-launcher exports these variables to every worker, the
emergency checkpoint reads them.

* ``RESILIENCY_PREEMPTED_EXIT_CODE``: the code a rank exits with after its emergency save (75);
  0 without a launcher, so plain ``torchrun`` finishes instead of restarting.
* ``RESILIENCY_EXIT_INFO_DIR``: a private directory of the launcher; a rank writes
  ``rank_<RANK>.json`` there (the saved step), and the launcher keeps a one-byte stop mark there.
* ``RESILIENCY_TERM_TIMEOUT_S``: seconds between the forwarded SIGTERM and SIGKILL.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
from typing import Any

from resiliency.checkpoint._emergency.mapped_byte import map_byte

logger = logging.getLogger(__name__)

PREEMPTED_EXIT_CODE_ENV = "RESILIENCY_PREEMPTED_EXIT_CODE"
EXIT_INFO_DIR_ENV = "RESILIENCY_EXIT_INFO_DIR"
TERM_TIMEOUT_ENV = "RESILIENCY_TERM_TIMEOUT_S"
#: One byte in the exit-info directory, 1 while ft-launcher itself stops the workers.
STOP_MARK_FILE = "launcher_stopping"


def preempted_exit_code() -> int:
    """The exit code after a successful emergency save (0 without a launcher)."""
    return int(os.environ.get(PREEMPTED_EXIT_CODE_ENV, "0") or 0)


def term_timeout_s() -> float | None:
    """Seconds from the forwarded SIGTERM to SIGKILL, when the launcher says."""
    raw = os.environ.get(TERM_TIMEOUT_ENV)
    return float(raw) if raw else None


def map_stop_mark() -> mmap.mmap | None:
    """Map ft-launcher's one-byte "the launcher is stopping these workers" mark, if there is one."""
    directory = os.environ.get(EXIT_INFO_DIR_ENV)
    if not directory:
        return None
    return map_byte(os.path.join(directory, STOP_MARK_FILE), "launcher stop mark")


def write_exit_info(rank: int, info: dict[str, Any]) -> None:
    """Write this rank's exit info for the launcher (atomically); log and go on on failure."""
    directory = os.environ.get(EXIT_INFO_DIR_ENV)
    if not directory:
        return
    path = os.path.join(directory, f"rank_{rank}.json")
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(info, fh)
        os.replace(tmp, path)
    except OSError as exc:
        logger.error("cannot write the exit info %s: %s", path, exc)
