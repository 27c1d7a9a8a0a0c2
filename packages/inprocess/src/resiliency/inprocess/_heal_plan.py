"""Who heals whom: the agreed step, the sources and the receivers, from every rank's status.

Pure functions of what every rank gathered (the same tensors on every rank), so every rank
computes the same plan without another message.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

from resiliency.inprocess.exception import HealError

#: A rank's step when its state is missing or was left half-updated (``Healer.updating``).
NO_STEP = -1


@dataclass(frozen=True)
class Plan:
    """The agreed step, the ranks that hold it (sources) and the ranks that need it."""

    step: int
    sources: list[int]
    receivers: list[int]


def agree(steps: list[int]) -> Plan:
    """The newest consistent step: its holders are the sources, every other rank receives.

    Args:
        steps: per rank of the group, its committed step, or ``NO_STEP``.

    Raises:
        HealError: no rank holds a consistent state.
    """
    newest = max(steps)
    if newest == NO_STEP:
        raise HealError(
            f"no rank of the {len(steps)} holds a consistent state (every one was interrupted "
            "in Healer.updating() or has none): nothing to heal from; restart the job from a "
            "checkpoint"
        )
    sources = [r for r, s in enumerate(steps) if s == newest]
    return Plan(newest, sources, [r for r, s in enumerate(steps) if s != newest])


def check_digests(plan: Plan, digests: list[tuple[int, int]]) -> tuple[Plan, tuple[int, int]]:
    """Keep the sources whose ``(crc32, length)`` is the majority's; the others receive too.

    Raises:
        HealError: the sources disagree and no digest has a strict majority.
    """
    counts = Counter(digests[r] for r in plan.sources)
    ranked = counts.most_common()
    if len(ranked) > 1 and ranked[0][1] == ranked[1][1]:
        held = "; ".join(
            f"ranks {[r for r in plan.sources if digests[r] == d]} crc32 {d[0]:08x} ({d[1]} bytes)"
            for d, _ in ranked
        )
        raise HealError(
            f"the ranks at step {plan.step} hold different states and none is a majority: "
            f"{held}; the job's replicas diverged, restart it from a checkpoint"
        )
    reference = ranked[0][0]
    good = [r for r in plan.sources if digests[r] == reference]
    diverged = [r for r in plan.sources if digests[r] != reference]
    return Plan(plan.step, good, sorted(plan.receivers + diverged)), reference


def assign(
    pending: list[int], sources: list[int], tried: dict[int, set[int]], step: int
) -> dict[int, int]:
    """A source per pending receiver, one it has not tried yet, spread over the sources.

    Raises:
        HealError: a receiver has tried every source.
    """
    out = {}
    for index, receiver in enumerate(pending):
        left = [s for s in sources if s not in tried.get(receiver, set())]
        if not left:
            raise HealError(
                f"rank {receiver} could not be healed to step {step}: the state sent by every "
                f"source (ranks {sources}) failed verification; restart the job from a checkpoint"
            )
        out[receiver] = left[index % len(left)]
    return out
