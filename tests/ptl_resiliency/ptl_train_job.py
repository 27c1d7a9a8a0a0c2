"""examples/ptl_train.py plus fault knobs the tests need (a model that hangs or raises).

Run as a script (``python tests/ptl_resiliency/train_job.py --work-dir ... [--hang-in step]``).
With ``--manual-clock`` the straggler detector reads a clock that only the training step moves
(by ``--step-time``, times ``--slow-factor`` on the slow rank), instead of sleeping: every score
is then exact.
"""

from __future__ import annotations

import functools
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
from lightning_flavour import load_example

from resiliency.ptl import StragglerDetectionCallback, shutdown_on

_EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ptl_train.py"
example = load_example(_EXAMPLE, "ptl_train_example")


class ManualClock:
    """A nanosecond clock that moves only when the training step advances it."""

    def __init__(self) -> None:
        self.now_ns = 0

    def __call__(self) -> int:
        return self.now_ns

    def advance(self, seconds: float) -> None:
        self.now_ns += round(seconds * 1e9)


class FaultyModel(example.TinyModel):
    """Hangs inside a training step or a checkpoint save, or raises, at a chosen step."""

    def __init__(
        self,
        hang_in: str | None,
        raise_at: int | None,
        fault_step: int,
        clock: ManualClock | None = None,
        **kw: Any,
    ):
        super().__init__(**kw)
        self.hang_in = hang_in
        self.raise_at = raise_at
        self.fault_step = fault_step
        self.clock = clock

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
        if self.clock is None:
            return super().training_step(batch, batch_idx)
        work = self.step_time * (self.slow_factor if self.global_rank == self.slow_rank else 1.0)
        self.clock.advance(work)  # the step's simulated work, on the detector's clock
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        if self.hang_in == "checkpointing" and self.global_step >= self.fault_step:
            self._hang("checkpointing")


def main() -> int:
    parser = example.build_parser()
    parser.add_argument("--hang-in", choices=["step", "checkpointing"])
    parser.add_argument("--raise-at-step", type=int)
    parser.add_argument("--fault-step", type=int, default=3)
    parser.add_argument("--shutdown-on-runtime-error", action="store_true")
    parser.add_argument(
        "--manual-clock",
        action="store_true",
        help="the straggler detector's clock moves by the simulated step time; no sleep",
    )
    args = parser.parse_args()
    clock = ManualClock() if args.manual_clock else None
    if clock is not None:
        # The example builds the callback itself; hand it the clock through its own name.
        example.StragglerDetectionCallback = functools.partial(
            StragglerDetectionCallback, clock=clock
        )
    resuming = (args.work_dir / "checkpoints" / "last.ckpt").exists()
    model = FaultyModel(
        hang_in=None if resuming and args.fault_when == "fresh" else args.hang_in,
        raise_at=args.raise_at_step,
        fault_step=args.fault_step,
        clock=clock,
        step_time=args.step_time,
        slow_rank=args.slow_rank,
        slow_factor=args.slow_factor,
    )
    ft_kwargs: dict[str, Any] = {}
    if args.shutdown_on_runtime_error:
        ft_kwargs["exception_handling_policy"] = shutdown_on(RuntimeError)
    result = example.run(args, model=model, **ft_kwargs)
    result["lightning"] = example.Trainer.__module__.split(".")[0]
    if result["is_global_zero"]:
        print("PTL_TRAIN_RESULT " + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
