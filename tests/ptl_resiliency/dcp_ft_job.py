"""One rank: FaultToleranceCallback with calculated timeouts beside DistributedCheckpointCallback.

Run as ``python dcp_ft_job.py WORK_DIR MAX_STEPS`` with ``FT_RANK_MONITOR_IPC_SOCKET`` set. It
saves every 2 steps under ``WORK_DIR/ckpt`` and resumes from there; the calculated timeouts go
to ``WORK_DIR/ft/_ft_state.json``.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from lightning_flavour import Trainer
from ptl_train_job import example

from resiliency.ptl import DistributedCheckpointCallback, FaultToleranceCallback


def main() -> int:
    work, max_steps = Path(sys.argv[1]), int(sys.argv[2])
    checkpoints = DistributedCheckpointCallback(work / "ckpt", every_n_train_steps=2)
    trainer = Trainer(
        accelerator="cpu",
        devices=1,
        max_steps=max_steps,
        callbacks=[
            FaultToleranceCallback(autoresume=False, calculate_timeouts=True, exp_dir=work / "ft"),
            checkpoints,
        ],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=work,
    )
    trainer.fit(example.TinyModel(step_time=0.01))
    result = {"resumed_step": checkpoints.resumed_step, "global_step": trainer.global_step}
    print("DCP_FT_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
