"""The opt-in ``every="auto"`` checkpoint interval: advised from the job's own ledger.

A job that saves "every N steps" can let its ledger choose N: at each start (so at each restart),
`AutoInterval.steps` reads the job's ledger (``RESILIENCY_GOODPUT_DIR``, the files of this job:
``<job>.*.jsonl``), runs `resiliency.goodput.advise` on it, and takes the tier's advised interval
in steps, clamped to the user's bounds. While the ledger cannot advise (too few failures, no save
of the tier yet, no ledger at all) it keeps the user's default. The checkpoint package makes every
rank use rank 0's answer (`resiliency.checkpoint.advised_every`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from resiliency.goodput.advice import advise
from resiliency.goodput.errors import ConfigError, GoodputError
from resiliency.goodput.ledger import read_ledger
from resiliency.goodput.recorder import DIR_ENV, JOB_ENVS, _safe
from resiliency.goodput.schema import TIERS

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AutoInterval:
    """Bounds of an advised checkpoint interval, in training steps.

    Args:
        min_steps: never save more often than this.
        max_steps: never save less often than this.
        default_steps: the interval while the ledger cannot advise.
        tier: the tier whose advice is taken.

    Raises:
        ConfigError: bounds that are not ``1 <= min_steps <= default_steps <= max_steps``, or
            an unknown tier.
    """

    min_steps: int = 10
    max_steps: int = 10_000
    default_steps: int = 100
    tier: str = "persistent"

    def __post_init__(self) -> None:
        if not 1 <= self.min_steps <= self.default_steps <= self.max_steps:
            raise ConfigError(
                "AutoInterval needs 1 <= min_steps <= default_steps <= max_steps, got "
                f"{self.min_steps}, {self.default_steps}, {self.max_steps}"
            )
        if self.tier not in TIERS:
            raise ConfigError(f"AutoInterval tier must be one of {TIERS}, not {self.tier!r}")

    def clamp(self, steps: int) -> int:
        """``steps`` within the bounds."""
        return min(max(steps, self.min_steps), self.max_steps)

    def steps(self, paths: Sequence[str | os.PathLike[str]] | None = None) -> tuple[int, str]:
        """The interval to use now, and why.

        Args:
            paths: ledger files or directories; default: this job's files in
                ``RESILIENCY_GOODPUT_DIR``.
        """
        if paths is None:
            paths = _job_files()
            if not paths:
                return self.default_steps, "no ledger of this job yet: the default"
        try:
            ledger = read_ledger(paths)
        except GoodputError as exc:
            return self.default_steps, f"ledger unreadable ({exc}): the default"
        advice = advise(ledger)
        tier = next((t for t in advice.tiers if t.tier == self.tier), None)
        if not advice.enough:
            why = f"{advice.failures} failure(s) in the ledger, too few to advise: the default"
            return self.default_steps, why
        advised = None if tier is None else tier.steps(tier.advised_interval_s)
        if tier is None or advised is None:
            return self.default_steps, f"no {self.tier} save in the ledger: the default"
        steps = self.clamp(advised)
        why = (
            f"advised {advised} steps (Daly, MTBF {advice.mtbf_s or 0:.0f} s, save blocks "
            f"{tier.save_blocked_s:.3g} s)"
        )
        if steps != advised:
            why += f", clamped to {steps}"
        logger.info("checkpoint interval: %d steps (%s)", steps, why)
        return steps, why


def _job_files() -> list[Path]:
    """This job's ledger files in ``RESILIENCY_GOODPUT_DIR`` (all of them without a job id)."""
    directory = os.environ.get(DIR_ENV)
    if not directory or not Path(directory).is_dir():
        return []
    job = next((os.environ[n] for n in JOB_ENVS if os.environ.get(n)), None)
    pattern = "*.jsonl" if job is None else f"{_safe(job)}.*.jsonl"  # as the recorder names it
    return sorted(Path(directory).glob(pattern))
