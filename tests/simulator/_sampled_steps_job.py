"""A training loop stand-in that records its steps through the real goodput recorder.

    python _sampled_steps_job.py LEDGER_DIR TRUTH_FILE ATTEMPT [RESUME_FROM LAST_STEP]

Attempt 0 steps every 50 ms until it is killed; after every step it writes the step it has
really finished to TRUTH_FILE (the recorder's step events are sampled, at most one a second plus
one per flush, so the ledger alone is behind). A later attempt records a checkpoint load of
RESUME_FROM, steps up to LAST_STEP and exits, flushing its ledger.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from resiliency.goodput import Recorder

STEP_S = 0.05


def main() -> None:
    ledger_dir, truth, attempt = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
    # The defaults of get_recorder(): the sampling a real job's ledger has.
    recorder = Recorder(ledger_dir, job="sampled", node="0", rank=0, attempt=attempt)
    step, last = 0, None
    if attempt > 0:
        step, last = int(sys.argv[4]), int(sys.argv[5])
        recorder.emit("checkpoint_load_started", tier="persistent")
        recorder.emit("checkpoint_loaded", step=step, tier="persistent", bytes=1, duration_s=0.0)
    tmp = truth.with_name(truth.name + ".tmp")
    while last is None or step < last:
        time.sleep(STEP_S)
        step += 1
        recorder.step(step)
        tmp.write_text(str(step))
        os.replace(tmp, truth)  # the test never reads a half-written number
    recorder.close()


if __name__ == "__main__":
    main()
