"""``Healer``: after an in-process restart, bring every rank to one agreed step from its peers.

Under DDP every rank holds the same model and optimizer state. A rank whose state is missing
(a new or re-initialised process) or half-updated (it failed inside ``Healer.updating()``), or
behind its peers, receives the newest consistent state from a live peer over
``torch.distributed``; every transfer is checked against the checksum the sources agree on, and
a copy that fails is fetched again from another peer. See docs/inprocess.md, "Healing".
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Protocol

import torch
import torch.distributed as dist

from resiliency.inprocess import (
    _heal_codec,
    _heal_faults,
    _heal_plan,
    _heal_report,
    _heal_transfer,
)
from resiliency.inprocess.exception import ConfigError, HealError
from resiliency.inprocess.wrap import CallWrapper

log = logging.getLogger(__name__)


class Stateful(Protocol):
    """What ``Healer`` heals: a module, an optimizer, anything with a state dict."""

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state_dict: Any, /) -> Any: ...


@dataclass(frozen=True)
class HealResult:
    """What one ``Healer.heal`` did, as seen by this rank.

    Attributes:
        step: the step every rank of the group holds now.
        healed: whether this rank's state was replaced by a peer's.
        source: the group rank it came from (None when not healed).
        previous_step: this rank's last committed step before (None: it had none, or it
            was invalidated).
        receivers: the group ranks that were healed.
        lost_steps: steps committed somewhere before the fault and not kept (the newest
            committed step of any rank less ``step``).
        nbytes: bytes this rank received.
        failed_copies: copies (to any rank) that failed verification and were fetched again.
        seconds: the whole heal on this rank, agreement included.
    """

    step: int
    healed: bool
    source: int | None
    previous_step: int | None
    receivers: tuple[int, ...]
    lost_steps: int
    nbytes: int
    failed_copies: int
    seconds: float


class Healer:
    """Keeps track of which step a rank's state is at, and heals it from its peers.

    Create it **outside** the wrapped function (it must outlive a restart), with what every
    rank holds alike (under DDP: the module and its optimizer), and call :meth:`heal` at the
    top of the wrapped function, after ``init_process_group`` and **before** wrapping the
    model in DDP (whose constructor would copy rank 0's parameters, healed or not, to all).

    Args:
        state: name -> object with ``state_dict()`` / ``load_state_dict()``.
        step: the step the state is at now (0 for a fresh model, the step of a checkpoint you
            loaded); None: this rank has no valid state and must receive one.
        per_rank: called on every rank at the end of each heal with its ``HealResult``: restore
            what differs per rank (RNG state, the sampler's position), derived from
            ``result.step`` or read from a node-local checkpoint (a collective call is safe
            here: every rank calls it at the same point).
        device: where the transfer's tensors travel; default: the CPU for gloo, the current
            CUDA device for NCCL.
    """

    def __init__(
        self,
        state: Mapping[str, Stateful],
        *,
        step: int | None = 0,
        per_rank: Callable[[HealResult], Any] | None = None,
        device: torch.device | str | None = None,
    ) -> None:
        if not state:
            raise ConfigError("Healer(state=...) needs at least one object to heal")
        for name, obj in state.items():
            if not (hasattr(obj, "state_dict") and hasattr(obj, "load_state_dict")):
                raise ConfigError(
                    f"Healer(state={{{name!r}: {type(obj).__name__}}}): expected an object "
                    "with state_dict() and load_state_dict() (a module, an optimizer)"
                )
        if step is not None and (not isinstance(step, int) or step < 0):
            raise ConfigError(f"Healer(step={step!r}): expected an integer >= 0 or None")
        self._state = dict(state)
        self._step = step
        self._dirty = False
        self._per_rank = per_rank
        self._device = torch.device(device) if device is not None else None
        self._atomic: Callable[[], contextlib.AbstractContextManager[Any]] | None = None

    @property
    def step(self) -> int | None:
        """The step the state is at; None while it is missing or half-updated."""
        return None if self._dirty else self._step

    def invalidate(self) -> None:
        """Mark this rank's state as missing: the next heal replaces it from a peer."""
        self._step = None
        self._dirty = True

    @contextlib.contextmanager
    def updating(self, step: int) -> Iterator[None]:
        """The block that changes the state (the optimizer step) to make it ``step``'s.

        An exception inside leaves the state half-updated: the next heal replaces it. When
        :meth:`heal` was given the ``CallWrapper``, the block is ``CallWrapper.atomic()``: a
        fault elsewhere never interrupts it, so healthy ranks always end it whole.
        """
        guard = self._atomic() if self._atomic is not None else contextlib.nullcontext()
        with guard:
            self._dirty = True
            yield
            self._step = step
            self._dirty = False

    def heal(
        self, group: dist.ProcessGroup | None = None, call_wrapper: CallWrapper | None = None
    ) -> HealResult:
        """Agree on one step and bring every rank of ``group`` to it. A collective.

        Args:
            group: the process group (default: the default group); every rank calls this.
            call_wrapper: the current call's wrapper, so that :meth:`updating` is atomic.

        Returns:
            What this rank did; ``result.step`` is where every rank resumes.

        Raises:
            HealError: no rank holds a consistent state, the sources disagree, every source's
                copy failed verification for some rank, or a received state does not fit.
        """
        started = time.monotonic()
        if call_wrapper is not None:
            self._atomic = call_wrapper.atomic
        device = self._device or _heal_transfer.transfer_device(group)
        me = dist.get_rank(group)
        previous = self._step
        mine = _heal_plan.NO_STEP if self.step is None else self.step
        rows = _heal_transfer.gather_ints(
            [mine, _heal_plan.NO_STEP if previous is None else previous], group, device
        )
        plan = _heal_plan.agree([row[0] for row in rows])
        lost = max(row[1] for row in rows) - plan.step
        digest = (-1, -1)
        crc, length = digest
        if plan.receivers:
            if me in plan.sources:
                digest = _heal_codec.digest(self._state_dicts())
            rows = _heal_transfer.gather_ints(list(digest), group, device)
            digests = [(r[0], r[1]) for r in rows]
            agreed, (crc, length) = _heal_plan.check_digests(plan, digests)
            if me in plan.sources and me in agreed.receivers:
                log.warning(
                    "rank %d: its state at step %d (crc32 %08x) differs from its peers' "
                    "(crc32 %08x): it is replaced",
                    me,
                    plan.step,
                    digest[0],
                    crc,
                )
            plan = agreed
        source, failed_copies = None, 0
        if plan.receivers:
            if me in plan.receivers:
                self._dirty = True  # a heal cut short never makes this rank a source
            source, failed_copies = self._receive_and_send(
                plan, me, digest=(crc, length), group=group, device=device
            )
        result = HealResult(
            step=plan.step,
            healed=source is not None,
            source=source,
            previous_step=previous,
            receivers=tuple(plan.receivers),
            lost_steps=lost,
            nbytes=length if source is not None else 0,
            failed_copies=failed_copies,
            seconds=time.monotonic() - started,
        )
        if me == 0:
            _heal_report.report_heal(
                plan,
                lost_steps=lost,
                nbytes=length if plan.receivers else 0,
                failed_copies=failed_copies,
                seconds=result.seconds,
                iteration=None if call_wrapper is None else call_wrapper.iteration,
            )
        if self._per_rank is not None:
            self._per_rank(result)
        return result

    def _receive_and_send(
        self,
        plan: _heal_plan.Plan,
        me: int,
        *,
        digest: tuple[int, int],
        group: dist.ProcessGroup | None,
        device: torch.device,
    ) -> tuple[int | None, int]:
        """Rounds of transfers until every receiver holds a verified copy.

        Returns the source this rank was healed from (None on a source) and the number of
        copies that failed verification (on every rank).
        """
        crc, length = digest
        pending = list(plan.receivers)
        tried: dict[int, set[int]] = {}
        healed_from, failed_copies = None, 0
        buffer = None  # packed on the first round this rank sends
        world = dist.get_world_size(group)
        while pending:
            assignment = _heal_plan.assign(pending, plan.sources, tried, plan.step)
            failed = [0] * world
            mine = sorted(r for r, s in assignment.items() if s == me)
            if mine and buffer is None:
                buffer = _heal_codec.pack(self._state_dicts())
            if buffer is not None:
                for receiver in mine:
                    began = time.monotonic()
                    _heal_faults.maybe_raise(me)
                    sent = _heal_faults.maybe_corrupt(buffer, me)
                    _heal_transfer.send(sent, receiver, group, device)
                    log.info(
                        "rank %d: sent its state at step %d to rank %d (%d bytes, %.3f s)",
                        me,
                        plan.step,
                        receiver,
                        length,
                        time.monotonic() - began,
                    )
            if me in assignment:
                source = assignment[me]
                began = time.monotonic()
                got = _heal_transfer.recv(length, source, group, device)
                got_crc = _heal_codec.crc32(got)
                if got_crc != crc:
                    failed[me] = 1
                    log.warning(
                        "rank %d: the state at step %d from rank %d failed verification "
                        "(crc32 %08x, expected %08x, %d bytes): retrying from another peer",
                        me,
                        plan.step,
                        source,
                        got_crc,
                        crc,
                        length,
                    )
                else:
                    self._load(got, plan.step, source)
                    healed_from = source
                    log.warning(
                        "rank %d: healed to step %d from rank %d: %d bytes in %.3f s "
                        "(crc32 %08x verified; it was at %s)",
                        me,
                        plan.step,
                        source,
                        length,
                        time.monotonic() - began,
                        crc,
                        "no consistent state" if self._step is None else f"step {self._step}",
                    )
                    self._step, self._dirty = plan.step, False
            failed = _heal_transfer.sum_flags(failed, group, device)
            failed_copies += sum(failed)
            for receiver, source in assignment.items():
                tried.setdefault(receiver, set()).add(source)
            pending = [r for r in pending if failed[r]]
        return healed_from, failed_copies

    def _state_dicts(self) -> dict[str, Any]:
        return {name: obj.state_dict() for name, obj in self._state.items()}

    def _load(self, buffer: torch.Tensor, step: int, source: int) -> None:
        state = _heal_codec.unpack(buffer)
        if set(state) != set(self._state):
            raise HealError(
                f"the state from rank {source} at step {step} holds {sorted(state)}, this rank "
                f"heals {sorted(self._state)}: every rank must build its Healer alike"
            )
        for name, obj in self._state.items():
            try:
                obj.load_state_dict(state[name])
            except (RuntimeError, ValueError, KeyError, TypeError) as exc:
                raise HealError(
                    f"the state {name!r} from rank {source} at step {step} does not fit this "
                    f"rank's {type(obj).__name__}: {type(exc).__name__}: {exc}"
                ) from exc
