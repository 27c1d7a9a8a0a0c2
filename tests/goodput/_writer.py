"""A process that appends events to a shared ledger (for the multi-process test)."""

import sys

from resiliency.goodput import Recorder

directory, rank, count = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
recorder = Recorder(
    directory, job="shared", node="n0", rank=rank, flush_interval_s=0.01, max_queue=7
)
for i in range(count):
    recorder.emit("straggler_detected", ranks=[rank], scores={"pad": "x" * (i % 300)})
# no close(): the exit handler flushes
