"""Leak checks around every test: a test that leaves a process, thread, socket, environment
variable or signal handler behind fails, with what leaked and which test left it.

Design
------
Hook wrappers, not a fixture, so that they see every fixture of the test (in a plugin, since
pytest calls no conftest hook for the session-scoped fixtures on the Session node):
``pytest_runtest_setup`` takes the *baseline* before any fixture of the test is set up, and
``pytest_runtest_teardown`` checks after every fixture its teardown finalizes has run,
``monkeypatch`` included: what monkeypatch changed is undone by then, so it is never a leak.

Broader-scoped (class/module/package/session) fixtures legitimately outlive one test. Whatever
appears while such a fixture is set up (``pytest_fixture_setup``, even when a test pulls it in
lazily with ``request.getfixturevalue``) is *owned* by that fixture: its processes (and their
descendants), threads and sockets are allowed for as long as the fixture lives, and its
environment and signal-handler changes become the expected state. When the fixture is finalized
(``pytest_fixture_post_finalizer``), what it owned must be gone too, and the environment and
handlers must be back to what they were before its setup: a module fixture that leaks fails the
module's last test, with the fixture named in the message.

What counts as a leak, compared with the baseline:

* **process**: a descendant of the pytest process (by ``/proc/<pid>/stat`` parent links) that is
  new and alive; or a new process carrying this run's ``RESILIENCY_LEAK_CHECK_TOKEN`` environment
  variable, which catches a worker orphaned when the test killed its parent. A zombie counts only
  when pytest itself is the parent that never reaped it. Leaked processes are SIGKILLed by pid
  after the report so they cannot spill into the next test.
  The test zygotes (tests/zygote.py, kept for the life of the test process) are never leaks and
  never owned by a fixture; every job they fork is checked as a process of the test.
* **thread**: a new ``threading.Thread`` still alive (threads that C code registered, the
  ``_DummyThread`` kind, cannot be joined from Python and are not checked).
* **socket**: a new ``socket:[inode]`` file descriptor of the pytest process.
* **env**: ``os.environ`` differs (aside from the few variables in ``_IGNORED_ENV`` that pytest
  or a third-party library sets for the whole process on first import).
* **signal**: ``signal.getsignal`` differs for any catchable signal; SIGALRM aside while
  pytest-timeout is loaded: it owns SIGALRM around every test, clears it when a test fails, and
  resets it to the default after each test anyway.

Processes, threads and sockets get a grace period (``GRACE_S``) for what is still exiting; before
a verdict the garbage collector runs once, so a socket kept only by a reference cycle is closed
deterministically instead of failing some runs and not others. A clean test pays for one scan
before and one after (about a millisecond).

A test may opt out with ``@pytest.mark.allow_leak("thread", reason="...")``; the reason is
required. Use it sparingly: the fix is almost always to stop, join, close or restore.
"""

from __future__ import annotations

import contextlib
import gc
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

# Tests sharing a module-scoped fixture stay on one xdist worker (tests/xdist_grouping.py).
pytest_plugins = ("xdist_grouping",)

# How long what is still exiting may take; the self-test shortens it to keep its leaks quick.
GRACE_S = float(os.environ.get("RESILIENCY_LEAK_GRACE_S", "5"))
KINDS = ("process", "thread", "socket", "env", "signal")
TOKEN_VAR = "RESILIENCY_LEAK_CHECK_TOKEN"
_HAS_PROC = os.path.isdir("/proc/self/fd")
# Variables set for the whole process by their owner, not by a test: pytest around every phase,
# third-party libraries the first time they are imported or used, whichever test that happens in.
_IGNORED_ENV = frozenset(
    {
        "PYTEST_CURRENT_TEST",
        "PYTORCH_NVML_BASED_CUDA_CHECK",  # set by `import lightning.fabric`
        "TORCHINDUCTOR_CACHE_DIR",  # pinned by torch inductor on its first cache look-up
    }
)
# Process-lifetime helpers the standard library starts once and keeps on purpose.
_SINGLETON_CMDLINES = (
    "from multiprocessing.resource_tracker import main",
    "from multiprocessing.forkserver import main",
)
# The test zygotes (tests/zygote.py, started once per test process by tests/zygote_client.py):
# kept on purpose like the helpers above, but every job they fork is still checked.
_ZYGOTE_SCRIPT = str(Path(__file__).resolve().with_name("zygote.py"))
_CATCHABLE = tuple(s for s in signal.valid_signals() if s not in (signal.SIGKILL, signal.SIGSTOP))
_SIGNAMES = {s.value: s.name for s in signal.Signals}  # real-time signals have no name
_MISSING = object()

ProcKey = tuple[int, int]  # (pid, start time in clock ticks): a reused pid is another process


@dataclass(frozen=True)
class ProcInfo:
    ppid: int
    state: str
    start: int  # clock ticks after boot: with the pid, it names one process even if pids wrap
    name: str  # the kernel's short command name: a zombie has no command line left


@dataclass
class Snapshot:
    """Everything the checks compare, taken at one moment."""

    pids: set[int]  # only the pids: reading every process's stat would cost milliseconds
    threads: set[threading.Thread]
    sockets: dict[int, int]  # inode -> fd
    env: dict[str, str]
    signals: dict[int, Any]


@dataclass
class Owned:
    """What a broad-scoped fixture brought up, and the state it replaced."""

    label: str
    procs: set[ProcKey] = field(default_factory=set)
    threads: set[threading.Thread] = field(default_factory=set)
    sockets: set[int] = field(default_factory=set)
    env_before: dict[str, Any] = field(default_factory=dict)
    signals_before: dict[int, Any] = field(default_factory=dict)


@dataclass
class RunState:
    """The baseline of the running test and what broad fixtures changed during it."""

    base: Snapshot
    expected_env: dict[str, str]
    expected_signals: dict[int, Any]
    released: list[Owned] = field(default_factory=list)


_owned: dict[int, Owned] = {}  # id(fixturedef) -> what it owns while alive
_permanent: set[ProcKey] = set()
_zygotes: set[ProcKey] = set()
_current: RunState | None = None
_token = ""


# --- snapshots ---------------------------------------------------------------------------------


def _pids() -> set[int]:
    if not _HAS_PROC:
        return set()
    return {int(name) for name in os.listdir("/proc") if name.isdigit()}


def _stat(pid: int) -> ProcInfo | None:
    data = _read(f"/proc/{pid}/stat")
    if not data:
        return None
    # The command name may hold spaces and parentheses: the fields start after the last ')'.
    close = data.rindex(b")")
    fields = data[close + 2 :].split()
    name = data[data.index(b"(") + 1 : close].decode(errors="replace")
    return ProcInfo(int(fields[1]), fields[0].decode(), int(fields[19]), name)


def _scan_sockets() -> dict[int, int]:
    sockets: dict[int, int] = {}
    if not _HAS_PROC:
        return sockets
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            sockets[int(target[8:-1])] = int(fd)
    return sockets


def _scan_signals() -> dict[int, Any]:
    handlers = {}
    for sig in _CATCHABLE:
        try:
            handlers[sig] = signal.getsignal(sig)
        except (ValueError, OSError):
            continue
    return handlers


def _snapshot() -> Snapshot:
    return Snapshot(
        pids=_pids(),
        threads=set(threading.enumerate()),
        sockets=_scan_sockets(),
        env=dict(os.environ),
        signals=_scan_signals(),
    )


def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except OSError:
        return b""


def _cmdline(pid: int) -> str:
    return _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace").strip()


# --- leak detection ----------------------------------------------------------------------------


class _Procs:
    """Lazily read process facts, cached for one check: only new processes and their ancestors
    are ever read."""

    def __init__(self) -> None:
        self.me = os.getpid()
        self._info: dict[int, ProcInfo | None] = {}
        self._token = f"{TOKEN_VAR}={_token}\0".encode()

    def info(self, pid: int) -> ProcInfo | None:
        if pid not in self._info:
            self._info[pid] = _stat(pid)
        return self._info[pid]

    def descends(self, pid: int, roots: set[int]) -> bool:
        for _ in range(4096):  # bounded: a pid can be reused into a loop while we walk
            if pid in roots:
                return True
            info = self.info(pid) if pid > 1 else None
            if info is None:
                return False
            pid = info.ppid
        return False

    def ours(self, pid: int) -> bool:
        """Descends from pytest, or inherited this run's token (an orphan of ours)."""
        info = self.info(pid)
        if info is None:
            return False
        return self.descends(info.ppid, {self.me}) or self._token in _read(f"/proc/{pid}/environ")


def _left_by(fixture: str | None) -> str:
    return f" left by fixture {fixture} after its teardown" if fixture else ""


def _proc_leaks(state: RunState) -> dict[ProcKey, str]:
    procs = _Procs()
    allowed = {key[0] for o in _owned.values() for key in o.procs} | {k[0] for k in _permanent}
    released = {key: o.label for o in state.released for key in o.procs}
    candidates = (_pids() - state.base.pids) | {key[0] for key in released}
    leaks = {}
    for pid in candidates:
        info = procs.info(pid)
        if info is None or pid == procs.me:
            continue
        key = (pid, info.start)
        if info.state == "Z" and info.ppid != procs.me:
            continue  # reaping it is its own parent's job, and that parent is checked itself
        if key in released:
            pass  # a broad fixture's process outliving the fixture's teardown
        elif pid in state.base.pids or not procs.ours(pid) or procs.descends(pid, allowed):
            continue
        if _is_zygote(procs, pid, info):
            continue
        cmd = _cmdline(pid)
        if any(s in cmd for s in _SINGLETON_CMDLINES):
            _permanent.add(key)
            continue
        zombie = " (zombie: exited, never reaped)" if info.state == "Z" else ""
        leaks[key] = (
            f"process pid {pid}{zombie}{_left_by(released.get(key))}: "
            f"{cmd[:200] or f'[{info.name}]'}"
        )
    return leaks


def _thread_leaks(state: RunState) -> list[str]:
    allowed = {t for o in _owned.values() for t in o.threads}
    released = {t: o.label for o in state.released for t in o.threads}
    frames = sys._current_frames()
    leaks = []
    for t in threading.enumerate():
        if isinstance(t, threading._DummyThread) or not t.is_alive():
            continue
        if (t in state.base.threads or t in allowed) and t not in released:
            continue
        frame = frames.get(t.ident or -1)
        where = f" at {frame.f_code.co_filename}:{frame.f_lineno}" if frame else ""
        kind = "daemon" if t.daemon else "non-daemon"
        leaks.append(f"thread {t.name!r} ({kind}){_left_by(released.get(t))}{where}")
    return leaks


def _describe_socket(inode: int) -> str:
    needle = f" {inode} ".encode()
    for proto in ("tcp", "tcp6", "udp", "udp6", "unix"):
        for line in _read(f"/proc/self/net/{proto}").splitlines()[1:]:
            if needle in line + b" ":
                parts = line.split()
                if proto == "unix":
                    path = parts[7].decode(errors="replace") if len(parts) > 7 else "unnamed"
                    return f"unix {path}"
                return f"{proto} local {parts[1].decode()} remote {parts[2].decode()}"
    return "unknown family"


def _socket_leaks(state: RunState) -> list[str]:
    allowed = {s for o in _owned.values() for s in o.sockets}
    released = {s: o.label for o in state.released for s in o.sockets}
    return [
        f"socket fd {fd} ({_describe_socket(inode)}){_left_by(released.get(inode))}"
        for inode, fd in _scan_sockets().items()
        if inode in released or (inode not in state.base.sockets and inode not in allowed)
    ]


def _env_leaks(state: RunState) -> list[str]:
    leaks = []
    for key in sorted((set(os.environ) | set(state.expected_env)) - _IGNORED_ENV):
        want, got = state.expected_env.get(key), os.environ.get(key)
        if want != got:
            leaks.append(f"environment variable {key}: {want!r} before, {got!r} after")
    return leaks


def _signal_leaks(state: RunState) -> list[str]:
    leaks = []
    for sig, handler in _scan_signals().items():
        want = state.expected_signals.get(sig, _MISSING)
        if want is not _MISSING and handler != want:
            leaks.append(f"signal handler for {_SIGNAMES.get(sig, sig)}: {want!r} -> {handler!r}")
    return leaks


def _find_leaks(state: RunState, allowed_kinds: set[str]) -> tuple[list[str], set[ProcKey]]:
    """Every leak (one line each) outside ``allowed_kinds``, and the leaked process keys."""
    lines: list[str] = []
    procs: dict[ProcKey, str] = {}
    if "process" not in allowed_kinds:
        procs = _proc_leaks(state)
        lines += procs.values()
    checks: dict[str, Callable[[RunState], list[str]]] = {
        "thread": _thread_leaks,
        "socket": _socket_leaks,
        "env": _env_leaks,
        "signal": _signal_leaks,
    }
    for kind, check in checks.items():
        lines += [] if kind in allowed_kinds else check(state)
    return lines, set(procs)


def _kill(keys: set[ProcKey]) -> None:
    """SIGKILL leaked processes by pid, after making sure each pid is still the same process."""
    procs = _Procs()
    for key in keys:
        info = procs.info(key[0])
        if info is not None and info.start == key[1] and info.state != "Z":
            with contextlib.suppress(OSError):
                os.kill(key[0], signal.SIGKILL)


def _check(state: RunState, allowed_kinds: set[str]) -> list[str]:
    lines, procs = _find_leaks(state, allowed_kinds)
    if lines:
        gc.collect()
        deadline = time.monotonic() + GRACE_S
        pause = 0.01
        while lines and time.monotonic() < deadline:
            time.sleep(pause)
            pause = min(pause * 2, 0.2)
            lines, procs = _find_leaks(state, allowed_kinds)
    _kill(procs)
    return lines


# --- hooks -------------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    global _token, _CATCHABLE
    if config.pluginmanager.hasplugin("timeout"):
        _CATCHABLE = tuple(s for s in _CATCHABLE if s != signal.SIGALRM)
    config.addinivalue_line(
        "markers",
        "allow_leak(*kinds, reason): let this test leave behind the given kinds of resources "
        f"({', '.join(KINDS)}); the reason is required",
    )
    # Hooks in a conftest run only for nodes under its directory, and session-scoped fixtures
    # belong to the Session node above it: registered as a plugin, the hooks see every fixture.
    config.pluginmanager.register(LeakChecks(), "resiliency-leak-checks")
    # Children inherit it, so a process orphaned by its killed parent is still recognised as ours.
    _token = f"{os.getpid()}-{secrets.token_hex(4)}"
    os.environ[TOKEN_VAR] = _token


def _allowed_kinds(item: pytest.Item) -> set[str]:
    kinds: set[str] = set()
    for mark in item.iter_markers("allow_leak"):
        reason = mark.kwargs.get("reason")
        unknown = set(mark.args) - set(KINDS)
        if not mark.args or unknown or not isinstance(reason, str) or not reason.strip():
            raise pytest.UsageError(
                f"{item.nodeid}: use @pytest.mark.allow_leak(<kinds from {KINDS}>, "
                f"reason='why'); got args={mark.args} kwargs={mark.kwargs}"
            )
        kinds |= set(mark.args)
    return kinds


def _is_zygote(procs: _Procs, pid: int, info: ProcInfo) -> bool:
    """A test zygote (recorded as such): this process's child running tests/zygote.py."""
    key = (pid, info.start)
    if key not in _zygotes and info.ppid == procs.me and _ZYGOTE_SCRIPT in _cmdline(pid).split():
        _zygotes.add(key)  # its jobs show its command line too (forks), but not its parent
    return key in _zygotes


def _new_procs(before: set[int], after: set[int]) -> set[ProcKey]:
    """New processes of ours, but a zygote: owned by no fixture, so that its jobs stay checked."""
    procs = _Procs()
    infos = {pid: procs.info(pid) for pid in after - before if procs.ours(pid)}
    return {
        (pid, info.start)
        for pid, info in infos.items()
        if info is not None and not _is_zygote(procs, pid, info)
    }


def _set_expected(expected: dict[str, str], key: str, value: Any) -> None:
    if value is _MISSING:
        expected.pop(key, None)
    else:
        expected[key] = value


class LeakChecks:
    """The hooks, as one plugin (see pytest_configure for why not conftest hooks)."""

    def pytest_collection_modifyitems(
        self, config: pytest.Config, items: list[pytest.Item]
    ) -> None:
        for item in items:
            _allowed_kinds(item)  # a malformed marker stops the run before any test runs

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_setup(self, item: pytest.Item) -> Iterator[None]:
        global _current
        base = _snapshot()
        _current = RunState(base, dict(base.env), dict(base.signals))
        return (yield)

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_runtest_teardown(
        self, item: pytest.Item, nextitem: pytest.Item | None
    ) -> Iterator[None]:
        global _current
        try:
            result = yield
        except BaseException as exc:
            # The teardown failed already: report that, with any leak as a note rather than instead.
            if _current is not None:
                lines = _check(_current, _allowed_kinds(item))
                if lines and hasattr(exc, "add_note"):
                    exc.add_note("also leaked:\n  " + "\n  ".join(lines))
            _current = None
            raise
        state, _current = _current, None
        if state is None:
            return result
        lines = _check(state, _allowed_kinds(item))
        if lines:
            pytest.fail(f"{item.nodeid} leaked:\n  " + "\n  ".join(lines), pytrace=False)
        return result

    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_fixture_setup(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> Any:
        if fixturedef.scope == "function":
            return (yield)
        before = _snapshot()
        try:
            return (yield)
        finally:
            after = _snapshot()
            owned = Owned(
                label=f"{fixturedef.argname!r} ({fixturedef.scope} scope)",
                procs=_new_procs(before.pids, after.pids),
                threads=after.threads - before.threads,
                sockets=set(after.sockets) - set(before.sockets),
                env_before={
                    k: before.env.get(k, _MISSING)
                    for k in set(before.env) | set(after.env)
                    if before.env.get(k) != after.env.get(k)
                },
                signals_before={
                    s: h for s, h in before.signals.items() if after.signals.get(s, h) != h
                },
            )
            _owned[id(fixturedef)] = owned
            if _current is not None:
                for key in owned.env_before:
                    _set_expected(_current.expected_env, key, after.env.get(key, _MISSING))
                for sig in owned.signals_before:
                    _current.expected_signals[sig] = after.signals[sig]

    def pytest_fixture_post_finalizer(
        self, fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest
    ) -> None:
        owned = _owned.pop(id(fixturedef), None)
        if owned is None or _current is None:
            return
        _current.released.append(owned)
        for key, value in owned.env_before.items():
            _set_expected(_current.expected_env, key, value)
        _current.expected_signals.update(owned.signals_before)
