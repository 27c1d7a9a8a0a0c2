"""A rank whose checkpoint directory is on a read-only file system (run inside a mount namespace).

    python readonly_root_worker.py ROOT MARKERS uncaught   # CheckpointManager(ROOT), uncaught
    python readonly_root_worker.py ROOT MARKERS caught     # prints the error as JSON, exits 0
    python readonly_root_worker.py ROOT MARKERS local      # the same, ROOT as a local tier
    python readonly_root_worker.py ROOT MARKERS remount    # ROOT writable at construction, then
                                                           # remounted read-only; prints the
                                                           # failed save's error as JSON

Before anything else it writes ``MARKERS/start-<RANK>-<TORCHELASTIC_RESTART_COUNT>``, so a test
can count the attempts a launcher made.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import torch

from resiliency.checkpoint import (
    CheckpointDirNotWritableError,
    CheckpointManager,
    LocalTier,
    PersistentTier,
    SaveFailedError,
)


def main() -> None:
    root, markers, mode = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
    rank = os.environ.get("RANK", "0")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    (markers / f"start-{rank}-{restart}").write_text(str(os.getpid()))
    if mode == "uncaught":
        CheckpointManager(root).close()
    elif mode in ("caught", "local"):
        try:
            if mode == "caught":
                CheckpointManager(root).close()
            else:  # the persistent tier is writable: only the local tier is refused
                persistent = PersistentTier(markers / "persistent", every=10)
                CheckpointManager(None, tiers=[LocalTier(root), persistent]).close()
        except CheckpointDirNotWritableError as exc:
            report = {"type": type(exc).__name__, "message": str(exc), "path": str(exc.path)}
            print(json.dumps({**report, "errno": exc.errno}))
    else:
        manager = CheckpointManager(root)
        subprocess.run(["mount", "-o", "remount,ro", str(root)], check=True)
        try:
            manager.save(20, {"weights": torch.zeros(4)})
            manager.wait()
        except SaveFailedError as exc:
            print(json.dumps({"type": type(exc).__name__, "message": str(exc)}))
        finally:
            manager.close()


if __name__ == "__main__":
    main()
