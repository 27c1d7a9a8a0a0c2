"""Which committed step to load: newest first, verified, agreed by every rank."""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any

import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException

from resiliency.checkpoint import _layout
from resiliency.checkpoint._collectives import agree as _agree
from resiliency.checkpoint._collectives import json_exchange as _json_collectives
from resiliency.checkpoint._read.verified import load_verified
from resiliency.checkpoint.errors import CheckpointCorruptError, CheckpointError, NoCheckpointError

logger = logging.getLogger(__name__)


def agree_on_step(
    root: Path, rank: int, world: int, group: dist.ProcessGroup | None, step: int | None
) -> tuple[int | None, int]:
    """Return ``(step, bytes)`` every rank verified, or ``(None, 0)`` when there is none.

    Each rank checks its share of the files of its newest candidate; one all-reduce (minimum and
    maximum) tells whether all ranks agree; if not, every rank retries below the minimum. A
    step rejected on one rank is therefore skipped on all of them.
    """
    local = _layout.committed_steps(root)
    verdicts: dict[int, tuple[bool, str, int]] = {}

    def check(s: int) -> bool:
        if s not in verdicts:
            verdicts[s] = _layout.verify_step(_layout.step_dir(root, s), rank, world)
            if not verdicts[s][0]:
                logger.warning("rank %d: checkpoint step %d skipped: %s", rank, s, verdicts[s][1])
        return verdicts[s][0]

    if step is not None:
        status = 2 if step not in local else (0 if check(step) else 1)
        code = _agree.min_max([status], group)[1][0]
        if code == 2:
            raise NoCheckpointError(f"step {step} is not committed under {root}")
        if code == 1:
            raise CheckpointCorruptError(f"step {step} under {root} failed verification")
        return step, verdicts[step][2]
    bound = None
    while True:
        candidate = next(
            (s for s in reversed(local) if (bound is None or s <= bound) and check(s)), -1
        )
        # Each rank checksums only its share of the files, so the reason a step is rejected
        # may be known to one rank alone: it travels with the candidates, and a rank that has
        # to give up a step it verified names who rejected it, which file and which check.
        rejected = {str(s): v[1] for s, v in verdicts.items() if not v[0] and s > candidate}
        everyone = _json_collectives.all_gather_json([candidate, len(local), rejected], group)
        lowest = min(int(e[0]) for e in everyone)
        if all(int(e[0]) == lowest for e in everyone):
            break
        if candidate > lowest:
            logger.warning(
                "rank %d: checkpoint step %d skipped: it failed verification on another rank (%s)",
                rank,
                candidate,
                _rejections(candidate, everyone, root),
            )
        bound = lowest
        if bound < 0:
            break
    if lowest < 0:
        if max(int(e[1]) for e in everyone) > 0:
            raise CheckpointCorruptError(
                f"no committed step under {root} verifies on every rank; see the warnings"
            )
        return None, 0
    return lowest, verdicts[lowest][2]


def _rejections(step: int, everyone: list[Any], root: Path) -> str:
    """Why the other ranks did not accept ``step``: each rank, with the file and the check."""
    reasons = []
    for other, (candidate, _, rejected) in enumerate(everyone):
        if int(candidate) >= step:
            continue
        why = rejected.get(str(step))
        reasons.append(
            f"rank {other}: {why}" if why else f"rank {other}: not committed under {root} there"
        )
    return "; ".join(reasons)


def load_step(
    state: dict[str, Any], path: Path, rank: int, group: dist.ProcessGroup | None
) -> None:
    """Load the agreed committed step at ``path`` into ``state`` on every rank (collective).

    Raises:
        CheckpointError: on every rank, naming each rank's failure, when loading failed on any.
    """
    failure: BaseException | None = None
    try:
        with warnings.catch_warnings():
            # Each rank loads on its own (below); DCP's "assuming a single process" is noise.
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            # The verified reader loads with no_dist on every rank: DCP's load would exchange
            # the read plans with pickled object collectives (ARCHITECTURE decision 1), and for
            # these checkpoints the exchange changes nothing. Every rank reads the global
            # .metadata and plans its own reads; the global step
            # (DefaultLoadPlanner.create_global_plan and FileSystemReader.prepare_global_plan,
            # torch 2.13) returns the local plans as they are. What the exchange gave besides,
            # a failure on one rank raised on every rank, the JSON all-gather below gives. It
            # checks only the files this rank reads: every file's size and a share of the
            # checksums were verified before the step was agreed on, and a file changed since
            # then fails the load here instead of loading wrong bytes.
            load_verified(state, path, only_what_it_reads=True)
    except (Exception, CheckpointException) as exc:
        failure = exc
    mine = f"rank {rank}: {failure}" if failure is not None else ""
    errors = [e for e in _json_collectives.all_gather_json(mine, group) if e]
    if errors:
        raise CheckpointError(f"loading {path} failed: {'; '.join(errors)}") from failure
