"""resiliency.inprocess.monitor_thread: NVRx's asynchronous-exception helpers, with real threads.

Every wait has a deadline and fails with a message rather than hanging the run.
"""

from __future__ import annotations

import sys
import threading
import time
import weakref
from collections.abc import Callable
from typing import Any

import pytest

from resiliency import inprocess
from resiliency.inprocess import exception, monitor_thread

DEADLINE_S = 10.0


class Interrupt(Exception):
    """The exception the tests send between threads."""


class Unrelated(Exception):
    """An exception reraise_if_unraisable is not asked about."""


def spin_until_interrupted(what: str, seconds: float = DEADLINE_S) -> None:
    """Run Python code in this thread until an asynchronous exception ends it, or fail."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.001)
    pytest.fail(f"{what}: nothing was raised within {seconds} s")


def spin_quietly(seconds: float) -> None:
    """Run Python code in this thread for ``seconds`` (nothing should interrupt it)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        time.sleep(0.001)


class BusyThread(threading.Thread):
    """Spins in a pure-Python loop until an exception ends it or its deadline passes."""

    def __init__(self) -> None:
        super().__init__(name="busy", daemon=True)
        self.started_spinning = threading.Event()
        self.caught: BaseException | None = None
        self.caught_at = 0.0

    def run(self) -> None:
        deadline = time.monotonic() + DEADLINE_S
        self.started_spinning.set()
        try:
            total = 0
            while time.monotonic() < deadline:
                total += 1
        except Interrupt as exc:
            self.caught = exc
            self.caught_at = time.monotonic()


def start_busy() -> tuple[BusyThread, int]:
    thread = BusyThread()
    thread.start()
    assert thread.started_spinning.wait(DEADLINE_S), "the busy thread did not start spinning"
    assert thread.ident is not None
    return thread, thread.ident


@pytest.fixture
def reported(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    """Replace sys.unraisablehook with a recorder (pytest's own would turn reports into
    warnings); monkeypatch restores the original after the test."""
    seen: list[Any] = []
    monkeypatch.setattr(sys, "unraisablehook", seen.append)
    return seen


def test_rank_should_restart_is_the_exception_module_class() -> None:
    assert monitor_thread.RankShouldRestart is exception.RankShouldRestart
    assert inprocess.monitor_thread is monitor_thread
    assert set(monitor_thread.__all__) == {
        "RankShouldRestart",
        "async_raise",
        "reraise_if_unraisable",
    }


def test_async_raise_interrupts_a_thread_busy_in_python() -> None:
    thread, tid = start_busy()
    sent_at = time.monotonic()
    monitor_thread.async_raise(tid, Interrupt)
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), f"the busy thread was not interrupted within {DEADLINE_S} s"
    assert isinstance(thread.caught, Interrupt), "the busy thread ended without the exception"
    assert thread.caught_at - sent_at < DEADLINE_S / 2


def test_async_raise_in_the_calling_thread_arrives_at_its_next_bytecode() -> None:
    with pytest.raises(Interrupt):
        monitor_thread.async_raise(threading.get_ident(), Interrupt)
        spin_until_interrupted("async_raise to the calling thread")


def test_async_raise_with_event_waits_for_the_event() -> None:
    thread, tid = start_busy()
    event = threading.Event()
    errors: list[BaseException] = []

    def send() -> None:
        try:
            monitor_thread.async_raise(tid, Interrupt, event)
        except BaseException as exc:
            errors.append(exc)

    sender = threading.Thread(target=send, name="sender", daemon=True)
    sender.start()
    spin_quietly(0.3)
    assert sender.is_alive(), "async_raise returned before its event was set"
    assert thread.caught is None, "the exception arrived before the event was set"
    assert thread.is_alive()

    set_at = time.monotonic()
    event.set()
    sender.join(DEADLINE_S)
    assert not sender.is_alive(), f"async_raise did not return within {DEADLINE_S} s of set()"
    assert errors == []
    thread.join(DEADLINE_S)
    assert not thread.is_alive(), f"the busy thread was not interrupted within {DEADLINE_S} s"
    assert isinstance(thread.caught, Interrupt)
    assert thread.caught_at >= set_at


def test_async_raise_to_an_unknown_thread_is_a_clear_error() -> None:
    ended = threading.Thread(target=lambda: None, name="ended")
    ended.start()
    ended.join(DEADLINE_S)
    assert not ended.is_alive()
    tid = ended.ident
    assert tid is not None
    if tid in sys._current_frames():  # the identifier was reused at once; take another
        tid = max(sys._current_frames()) + 4096
    with pytest.raises(RuntimeError, match=rf"no thread with identifier {tid}"):
        monitor_thread.async_raise(tid, Interrupt)


@pytest.mark.parametrize("bad", [Interrupt(), "Interrupt", None, int])
def test_async_raise_wants_an_exception_class(bad: Any) -> None:
    with pytest.raises(TypeError, match="exc_type must be an exception class"):
        monitor_thread.async_raise(threading.get_ident(), bad)


@pytest.mark.parametrize("bad", [True, -1, "1", 1.0])
def test_async_raise_wants_a_thread_identifier(bad: Any) -> None:
    with pytest.raises(TypeError, match="tid must be a thread identifier"):
        monitor_thread.async_raise(bad, Interrupt)


class RaisesInDel:
    def __init__(self, exc_type: type[BaseException]) -> None:
        self.exc_type = exc_type

    def __del__(self) -> None:
        raise self.exc_type("raised in __del__")


def drop_raising_object(exc_type: type[BaseException]) -> None:
    obj = RaisesInDel(exc_type)
    del obj  # __del__ runs here; its exception can only be reported


def run_finalizer_that_raises(exc_type: type[BaseException]) -> None:
    class Target:
        pass

    def callback() -> None:
        raise exc_type("raised in a finalizer")

    target = Target()
    weakref.finalize(target, callback)
    del target


def test_context_manager_reraises_from_del(reported: list[Any]) -> None:
    assert threading.current_thread() is threading.main_thread()
    hook = sys.unraisablehook
    with pytest.raises(Interrupt), monitor_thread.reraise_if_unraisable(Interrupt):
        drop_raising_object(Interrupt)
        spin_until_interrupted("reraise_if_unraisable (context manager, __del__)")
    assert sys.unraisablehook is hook, "the previous hook was not restored"
    assert len(reported) == 1, "the previous hook was not called once"
    assert reported[0].exc_type is Interrupt


def test_decorator_reraises_from_a_finalizer(reported: list[Any]) -> None:
    hook = sys.unraisablehook
    seen_inside: list[Callable[..., object]] = []

    @monitor_thread.reraise_if_unraisable(Interrupt)
    def body() -> None:
        seen_inside.append(sys.unraisablehook)
        run_finalizer_that_raises(Interrupt)
        spin_until_interrupted("reraise_if_unraisable (decorator, weakref.finalize)")

    for _ in range(2):  # each call wraps the hook anew
        with pytest.raises(Interrupt):
            body()
        assert sys.unraisablehook is hook, "the previous hook was not restored"
    assert len(seen_inside) == 2
    assert all(inside is not hook for inside in seen_inside), "the hook was not wrapped"
    assert [args.exc_type for args in reported] == [Interrupt, Interrupt]


def test_a_subclass_is_reraised_as_the_requested_class(reported: list[Any]) -> None:
    class Narrow(Interrupt):
        pass

    with pytest.raises(Interrupt), monitor_thread.reraise_if_unraisable(Interrupt):
        drop_raising_object(Narrow)
        spin_until_interrupted("reraise_if_unraisable (subclass)")


def test_the_reraise_waits_until_the_main_thread_left_the_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A raise that landed inside the hook would itself be reported and lost."""
    inside_hook: list[str] = []

    def slow_hook(_args: Any) -> None:
        try:
            spin_quietly(0.3)  # Python code in the main thread, inside the hook
        except Interrupt:
            inside_hook.append("interrupted inside the hook")
            raise
        inside_hook.append("returned")

    monkeypatch.setattr(sys, "unraisablehook", slow_hook)
    with pytest.raises(Interrupt), monitor_thread.reraise_if_unraisable(Interrupt):
        drop_raising_object(Interrupt)
        spin_until_interrupted("reraise_if_unraisable (slow previous hook)")
    assert inside_hook == ["returned"]


def test_other_exceptions_are_only_reported(reported: list[Any]) -> None:
    with monitor_thread.reraise_if_unraisable(Interrupt):
        drop_raising_object(Unrelated)
        spin_quietly(0.3)  # an Interrupt raised here would fail the test
    assert [args.exc_type for args in reported] == [Unrelated]


def test_outside_the_block_nothing_is_reraised(reported: list[Any]) -> None:
    with monitor_thread.reraise_if_unraisable(Interrupt):
        pass
    drop_raising_object(Interrupt)
    spin_quietly(0.3)
    assert [args.exc_type for args in reported] == [Interrupt]


def test_the_hook_is_restored_when_the_block_raises(reported: list[Any]) -> None:
    hook = sys.unraisablehook
    with pytest.raises(Unrelated), monitor_thread.reraise_if_unraisable(Interrupt):
        raise Unrelated("leaves the block")
    assert sys.unraisablehook is hook


def test_reraise_if_unraisable_wants_an_exception_class() -> None:
    with pytest.raises(TypeError, match="exc_type must be an exception class"):
        monitor_thread.reraise_if_unraisable("Interrupt")  # type: ignore[arg-type]
