"""A rank that starts its checkpoint writer, says so, and waits to be SIGKILLed.

    python writer_orphan_rank.py OUT [PYTHONPATH_FOR_THE_WRITER]

Starts one writer with the product's client (``WriterProcess``), writes ``OUT/rank.json``
(``{"rank": pid, "writer": pid}``) and sleeps until it is killed (at most 300 s, then it
exits 3). With a second argument, the writer starts with that ``PYTHONPATH``: a test puts a
slow stand-in for an import there to hold the writer inside its imports for as long as it
needs.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from resiliency.checkpoint._writer.client import WriterProcess


def main() -> int:
    out = Path(sys.argv[1])
    if len(sys.argv) > 2:
        os.environ["PYTHONPATH"] = sys.argv[2]  # the writer's environment is copied from ours
    writer = WriterProcess()
    tmp = out / "rank.json.tmp"
    tmp.write_text(json.dumps({"rank": os.getpid(), "writer": writer.pid}))
    tmp.replace(out / "rank.json")
    time.sleep(300)  # the test SIGKILLs this rank long before
    return 3


if __name__ == "__main__":
    sys.exit(main())
