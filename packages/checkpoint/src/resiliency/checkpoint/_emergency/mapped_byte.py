"""Map another process's one-byte mark read-only, for a signal handler to read without I/O.

Both marks a rank reads in its SIGTERM handler (ft-launcher's stop mark, its rank monitor's
termination mark) are such a byte; their writers replace the file rather than truncate it, so the
mapping stays valid for the rank's life.
"""

from __future__ import annotations

import logging
import mmap
import os

logger = logging.getLogger(__name__)


def map_byte(path: str | os.PathLike[str], what: str) -> mmap.mmap | None:
    """Map the first byte of ``path`` read-only; None (logged at debug) when it cannot be.

    Args:
        path: The mark's file.
        what: What the mark is, for the log line (e.g. "launcher stop mark").

    Returns:
        The mapping, or None: an older writer without the mark, so every SIGTERM counts.
    """
    try:
        with open(path, "rb") as fh:
            return mmap.mmap(fh.fileno(), 1, prot=mmap.PROT_READ)
    except (OSError, ValueError) as exc:
        logger.debug("no %s at %s: %s", what, path, exc)
        return None
