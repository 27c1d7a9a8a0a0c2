"""A plain torchrun-style rank: it never connects to its monitor (no RankMonitorClient at all).

It records start-<rank>-<attempt>-<pid>, works for --seconds, records done-<rank>-<attempt>.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

RANK = int(os.environ.get("RANK", "0"))
ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--marker-dir", type=Path, required=True)
    parser.add_argument("--seconds", type=float, default=4.0)
    args = parser.parse_args()
    (args.marker_dir / f"start-{RANK}-{ATTEMPT}-{os.getpid()}").write_text("")
    time.sleep(args.seconds)  # the "training": longer than rank_startup_timeout
    (args.marker_dir / f"done-{RANK}-{ATTEMPT}").write_text("")
    return 0


if __name__ == "__main__":
    sys.exit(main())
