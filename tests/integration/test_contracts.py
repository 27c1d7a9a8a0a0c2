"""Every agreement between processes of different packages, checked from both sides.

Where one package may import the other, the constant has one home and the other side imports
it (nothing to check here but that it does). Where neither may import the other (the launcher
and the checkpoint, ptl or the simulator; ft-core and the simulator; the supervisor, an extra of
the launcher), each side keeps its copy in a module named for the contract, and this file is
the one place that holds both copies against each other, and runs one side's writer against the
other side's reader where the agreement is a file. docs/environment.md lists every variable.
"""

from __future__ import annotations

import ast
import importlib
import os
import re
import signal
from pathlib import Path

import pytest

from resiliency.checkpoint._emergency.launcher_contract import map_stop_mark, write_exit_info
from resiliency.checkpoint._emergency.monitor_contract import map_termination_mark
from resiliency.ft import (
    FAULT_HOOK_SIGNALS,
    IPC_SOCKET_ENV,
    TerminationMark,
    termination_mark_path_for,
)
from resiliency.goodput import Recorder, host_ledger_files, ledger_path
from resiliency.inprocess import _rejoin, _unabortable
from resiliency.launcher._contracts import INPROCESS_REJOIN_FILE_ENV, INPROCESS_UNABORTABLE_DIR_ENV
from resiliency.launcher._preemption import PREEMPTED_EXIT_CODE, Preemption
from resiliency.launcher._respawn import unabortable_reason
from resiliency.supervisor._ledger import LedgerTail

# (what is agreed, one side "module:attribute", the other side "module:attribute")
COPIES = [
    (
        "the in-rank fault hook's switch",
        "resiliency.ft:FAULT_HOOK_ENV",
        "resiliency.simulator._contracts:HOOK_ENV",
    ),
    (
        "the in-rank fault hook's signals",
        "resiliency.ft:FAULT_HOOK_SIGNALS",
        "resiliency.simulator._contracts:HOOK_SIGNALS",
    ),
    (
        "the forked workers' environment directory",
        "resiliency.launcher._contracts:FORKED_ENVIRON_DIR_ENV",
        "resiliency.simulator._contracts:FORKED_ENVIRON_DIR_VAR",
    ),
    (
        "the exit code after an emergency save",
        "resiliency.launcher._contracts:PREEMPTED_EXIT_CODE_ENV",
        "resiliency.checkpoint:PREEMPTED_EXIT_CODE_ENV",
    ),
    (
        "the exit-info directory",
        "resiliency.launcher._contracts:EXIT_INFO_DIR_ENV",
        "resiliency.checkpoint:EXIT_INFO_DIR_ENV",
    ),
    (
        "the SIGTERM-to-SIGKILL time",
        "resiliency.launcher._contracts:TERM_TIMEOUT_ENV",
        "resiliency.checkpoint:TERM_TIMEOUT_ENV",
    ),
    (
        "the launcher's stop mark",
        "resiliency.launcher._contracts:STOP_MARK_FILE",
        "resiliency.checkpoint._emergency.launcher_contract:STOP_MARK_FILE",
    ),
    (
        "the finished-training flag file",
        "resiliency.launcher._contracts:FINISHED_FLAG_ENV",
        "resiliency.ptl.autoresume:FINISHED_FLAG_ENV",
    ),
    (
        "the respawned worker's rejoin file",
        "resiliency.launcher._contracts:INPROCESS_REJOIN_FILE_ENV",
        "resiliency.inprocess._launcher_contract:REJOIN_FILE_ENV",
    ),
    (
        "where an unabortable rank asks for its respawn",
        "resiliency.launcher._contracts:INPROCESS_UNABORTABLE_DIR_ENV",
        "resiliency.inprocess._launcher_contract:UNABORTABLE_DIR_ENV",
    ),
    (
        "the unabortable rank's file",
        "resiliency.launcher._contracts:INPROCESS_UNABORTABLE_FILE",
        "resiliency.inprocess._launcher_contract:UNABORTABLE_FILE",
    ),
    (
        "the port of the Wrapper's store the launcher hosts",
        "resiliency.launcher._contracts:INPROCESS_STORE_PORT_ENV",
        "resiliency.inprocess._launcher_contract:STORE_PORT_ENV",
    ),
    (
        "a node's id for the supervisor",
        "resiliency.launcher._contracts:NODE_ID_ENV",
        "resiliency.supervisor:NODE_ID_ENV",
    ),
    (
        "the rank monitor's socket",
        "resiliency.ft:IPC_SOCKET_ENV",
        "resiliency.checkpoint._emergency.monitor_contract:MONITOR_SOCKET_ENV",
    ),
    (
        "the rank monitor's termination mark",
        "resiliency.ft:TERMINATION_MARK_NAME",
        "resiliency.checkpoint._emergency.monitor_contract:TERMINATION_MARK_NAME",
    ),
]


def _value(spec: str) -> object:
    module, _, attr = spec.partition(":")
    return getattr(importlib.import_module(module), attr)


@pytest.mark.parametrize(("what", "one", "other"), COPIES, ids=[c[0] for c in COPIES])
def test_both_copies_of_an_agreement_are_the_same(what: str, one: str, other: str) -> None:
    assert _value(one) == _value(other), f"{what}: {one} and {other} differ"


def test_the_fault_hook_signals_are_real_time_signals_the_hook_handles() -> None:
    for kind, offset in FAULT_HOOK_SIGNALS.items():
        number = int(signal.SIGRTMIN) + offset
        assert number <= int(signal.SIGRTMAX), kind


def test_exit_info_written_by_a_rank_is_read_by_the_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    launcher = Preemption(term_timeout=30.0)
    try:
        for name, value in launcher.worker_env().items():
            monkeypatch.setenv(name, value)
        # the rank's side: its saved step, then its exit code
        write_exit_info(0, {"reason": "preempted", "step": 12})
        verdict = launcher.verdict({0: PREEMPTED_EXIT_CODE})
        assert verdict is not None and "saved step 12" in verdict
        # the stop mark: the launcher writes the byte, the rank's map of it sees it change
        mark = map_stop_mark()
        assert mark is not None and mark[0] == 0
        launcher.launcher_stopping(True)
        assert mark[0] == 1
        launcher.launcher_stopping(False)
        assert mark[0] == 0
        mark.close()
    finally:
        launcher.close()


def test_the_monitor_s_termination_mark_is_the_one_the_rank_maps(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The monitor writes the mark beside its socket; the rank's map of it sees every change."""
    socket_path = tmp_path / "rank-3.sock"
    monkeypatch.setenv(IPC_SOCKET_ENV, str(socket_path))
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert map_termination_mark() is None  # no monitor (yet): every SIGTERM counts
    mark = TerminationMark(termination_mark_path_for(socket_path, 3))
    mark.create()
    seen = map_termination_mark()
    assert seen is not None and seen[0] == 0
    mark.set(True)
    assert seen[0] == 1
    mark.set(False)
    assert seen[0] == 0
    # a restarted monitor writes a new file: the old mapping stays readable (no SIGBUS)
    mark.set(True)
    mark.create()
    assert seen[0] == 1
    seen.close()
    mark.remove()


def test_the_node_ledger_a_recorder_writes_is_the_one_the_sensor_follows(tmp_path: Path) -> None:
    tail = LedgerTail(tmp_path)  # this machine's files, as a node's sensor reads them
    recorder = Recorder(tmp_path, job="job 7/a", rank=0)  # characters the naming replaces
    try:
        recorder.step(41)
        recorder.flush()
    finally:
        recorder.close()
    assert host_ledger_files(tmp_path) == [ledger_path(tmp_path, "job 7/a")]
    assert host_ledger_files(tmp_path, "another-host") == []
    tail.poll({0})
    assert tail.step == 41


def test_a_rejoined_worker_s_file_is_the_one_the_launcher_waits_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Wrapper's side writes the file named by the launcher's variable, atomically."""
    marker = tmp_path / "rejoined-2-0"
    monkeypatch.setenv(INPROCESS_REJOIN_FILE_ENV, str(marker))
    _rejoin.announce()
    assert marker.read_text() == str(os.getpid())
    assert [p.name for p in tmp_path.iterdir()] == [marker.name]
    # a later restart of the same process is an ordinary one
    assert INPROCESS_REJOIN_FILE_ENV not in os.environ


_OWN_VARIABLE = re.compile(r"^(RESILIENCY|FT|FAULT_TOL|ETCDCTL)_[A-Z0-9_]+$")
_DOCS = Path(__file__).resolve().parents[2] / "docs" / "environment.md"


def _variables_in(source: Path) -> set[str]:
    """String constants shaped like the toolkit's variables, minus ``__all__`` entries."""
    tree = ast.parse(source.read_text(), str(source))
    exported: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            exported.update(id(c) for c in ast.walk(node.value))
    return {
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _OWN_VARIABLE.match(node.value)
        and id(node) not in exported
    }


def test_docs_environment_lists_every_variable_the_packages_use() -> None:
    packages = Path(__file__).resolve().parents[2] / "packages"
    used = set().union(*(_variables_in(p) for p in packages.glob("*/src/**/*.py")))
    assert "RESILIENCY_GOODPUT_DIR" in used and "FT_RANK_MONITOR_IPC_SOCKET" in used
    documented = set(re.findall(r"`([A-Z][A-Z0-9_]+)`", _DOCS.read_text()))
    missing = sorted(used - documented)
    assert not missing, f"docs/environment.md does not list {missing}"


def test_an_unabortable_rank_s_request_is_the_one_the_launcher_reads(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The Wrapper's side names its file by its pid in the launcher's directory; the launcher
    finds it only for that pid, reads the reason and consumes it."""
    # without the launcher's variable (plain torchrun) nothing is written
    monkeypatch.delenv(INPROCESS_UNABORTABLE_DIR_ENV, raising=False)
    assert not _unabortable.request_respawn("stuck", hosting_store=False)
    monkeypatch.setenv(INPROCESS_UNABORTABLE_DIR_ENV, str(tmp_path))
    # the rank hosting the Wrapper's store cannot be respawned alone: it asks for nothing
    assert not _unabortable.request_respawn("stuck", hosting_store=True)
    assert list(tmp_path.iterdir()) == []
    why = "rank 2 could not be aborted in-process"
    assert _unabortable.request_respawn(why, hosting_store=False)
    assert unabortable_reason(tmp_path, os.getpid() + 1) is None  # another worker's SIGTERM
    assert unabortable_reason(tmp_path, os.getpid()) == why
    assert list(tmp_path.iterdir()) == []  # consumed: a later SIGTERM of that pid is not one
    assert unabortable_reason(tmp_path, os.getpid()) is None
    # a directory it cannot write to: the Wrapper says so and reports the rank gone instead
    monkeypatch.setenv(INPROCESS_UNABORTABLE_DIR_ENV, str(tmp_path / "missing"))
    assert not _unabortable.request_respawn("stuck", hosting_store=False)
