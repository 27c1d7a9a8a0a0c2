"""examples/ptl_train.py plus fault knobs the tests need (a model that hangs or raises).

Run as a script (``python tests/ptl_resiliency/train_job.py --work-dir ... [--hang-in step]``).
"""

from __future__ import annotations

import importlib.util
import json
import sys
import time
from pathlib import Path
from typing import Any

from resiliency.ptl import shutdown_on

_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ptl_train.py"
_spec = importlib.util.spec_from_file_location("ptl_train_example", _EXAMPLE)
assert _spec is not None and _spec.loader is not None
example = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(example)


class FaultyModel(example.TinyModel):
    """Hangs inside a training step or a checkpoint save, or raises, at a chosen step."""

    def __init__(self, hang_in: str | None, raise_at: int | None, fault_step: int, **kw: Any):
        super().__init__(**kw)
        self.hang_in = hang_in
        self.raise_at = raise_at
        self.fault_step = fault_step

    @staticmethod
    def _hang(where: str) -> None:
        print(f"TEST_HANG {where}", flush=True)
        while True:
            time.sleep(1.0)

    def training_step(self, batch: Any, batch_idx: int) -> Any:
        if self.hang_in == "step" and self.global_step == self.fault_step:
            self._hang("step")
        if self.raise_at is not None and self.global_step == self.raise_at:
            raise RuntimeError(f"unrecoverable data error at step {self.global_step}")
        return super().training_step(batch, batch_idx)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.hang_in == "checkpointing" and self.global_step >= self.fault_step:
            self._hang("checkpointing")


def main() -> int:
    parser = example.build_parser()
    parser.add_argument("--hang-in", choices=["step", "checkpointing"])
    parser.add_argument("--raise-at-step", type=int)
    parser.add_argument("--fault-step", type=int, default=3)
    parser.add_argument("--shutdown-on-runtime-error", action="store_true")
    args = parser.parse_args()
    resuming = (args.work_dir / "checkpoints" / "last.ckpt").exists()
    model = FaultyModel(
        hang_in=None if resuming and args.fault_when == "fresh" else args.hang_in,
        raise_at=args.raise_at_step,
        fault_step=args.fault_step,
        step_time=args.step_time,
        slow_rank=args.slow_rank,
        slow_factor=args.slow_factor,
    )
    ft_kwargs: dict[str, Any] = {}
    if args.shutdown_on_runtime_error:
        ft_kwargs["exception_handling_policy"] = shutdown_on(RuntimeError)
    result = example.run(args, model=model, **ft_kwargs)
    if result["is_global_zero"]:
        print("PTL_TRAIN_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
