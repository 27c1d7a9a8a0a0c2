"""A finished heal: rank 0's log line and its ``inprocess_heal`` event in the goodput ledger.

Written only after a restart (or when state moved), and only when the ledger directory is set
(`resiliency.goodput.DIR_ENV`). Recording never stops training: a problem is logged.
"""

from __future__ import annotations

import logging
import os

from resiliency.goodput import DIR_ENV, get_recorder
from resiliency.inprocess._heal_plan import Plan

log = logging.getLogger(__name__)


def report_heal(
    plan: Plan,
    *,
    lost_steps: int,
    nbytes: int,
    failed_copies: int,
    seconds: float,
    iteration: int | None,
) -> None:
    """On the group's rank 0: log the heal and, after a restart, record it.

    Args:
        plan: the agreed step, its sources and the ranks healed.
        lost_steps: steps committed before the fault that no rank kept.
        nbytes: bytes of state each healed rank received (0 when none was).
        failed_copies: copies that failed verification and were fetched again.
        seconds: the heal on this rank.
        iteration: the wrapper's iteration (None without a ``CallWrapper``).
    """
    after_fault = bool(plan.receivers) or bool(iteration)
    # a heal after a fault is as visible as the restart's own line
    log.log(
        logging.WARNING if after_fault else logging.INFO,
        "rank 0: healing: every rank resumes at step %d (%d steps lost); ranks %s healed from "
        "ranks %s (%d bytes each, %d copies failed verification) in %.3f s",
        plan.step,
        lost_steps,
        plan.receivers or "none",
        plan.sources,
        nbytes,
        failed_copies,
        seconds,
    )
    if not after_fault or not os.environ.get(DIR_ENV):
        return
    extra = {} if iteration is None else {"iteration": iteration}
    try:
        get_recorder().emit(
            "inprocess_heal",
            step=plan.step,
            lost_steps=lost_steps,
            healed_ranks=list(plan.receivers),
            source_ranks=list(plan.sources),
            bytes=nbytes,
            failed_copies=failed_copies,
            duration_s=round(seconds, 6),
            **extra,
        )
    except Exception as exc:  # the ledger is a record: never stop training for it
        log.warning(
            "rank 0: could not record the heal at step %d in the goodput ledger (%s: %s); "
            "training goes on",
            plan.step,
            type(exc).__name__,
            exc,
        )
