"""One rank of a plain gloo group that reports a reloaded step to ``inprocess.Rollback``.

``python rollback_ranks.py RANK WORLD PORT STEP TRAINED``: TRAINED is the step this process
trained to before (-1: none). Prints one JSON line: the ``RollbackResult``, or the error.
"""

from __future__ import annotations

import json
import sys
from datetime import timedelta

import torch.distributed as dist

from resiliency import inprocess


def main() -> int:
    rank, world, port, step, trained = (int(x) for x in sys.argv[1:6])
    store = dist.TCPStore(
        "127.0.0.1", port, world, is_master=rank == 0, timeout=timedelta(seconds=60)
    )
    dist.init_process_group(
        "gloo", store=store, rank=rank, world_size=world, timeout=timedelta(seconds=60)
    )
    rollback = inprocess.Rollback()
    if trained >= 0:
        rollback.trained(trained)
    try:
        result = rollback.resumed(step)
    except inprocess.RollbackError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
    else:
        print(
            json.dumps(
                {
                    "step": result.step,
                    "trained": list(result.trained_steps),
                    "lost": result.lost_steps,
                    "iteration": result.iteration,
                    "trained_step": rollback.trained_step,
                }
            ),
            flush=True,
        )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
