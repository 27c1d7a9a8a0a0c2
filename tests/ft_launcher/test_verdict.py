"""Hang verdicts from faulthandler dumps: real dumps of real threads, and parsed text."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from resiliency.launcher._diagnosis import culprit_cause
from resiliency.launcher.verdict import (
    Frame,
    analyze_hang,
    innermost_frame,
    judge_frames,
    parse_stack_dump,
)


def _dump(where: str) -> str:
    """A real faulthandler dump of a process stopped in function ``where``."""
    code = textwrap.dedent(
        f"""
        import faulthandler, sys, threading, time
        def collective():
            faulthandler.dump_traceback(file=sys.stdout, all_threads=True)
        def data_loader():
            faulthandler.dump_traceback(file=sys.stdout, all_threads=True)
        threading.Thread(target=time.sleep, args=(5,), daemon=True).start()  # started on return
        {where}()
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    return proc.stdout


def test_parse_real_dump_finds_main_thread_innermost_frame():
    stacks = parse_stack_dump(_dump("collective"))
    assert len(stacks) == 2  # the helper thread and the main thread
    main = [s for s in stacks if s.frames and s.frames[-1].name == "<module>"]
    assert len(main) == 1
    assert main[0].frames[0].name == "collective"


def test_culprit_is_the_rank_elsewhere():
    waiting, stuck = _dump("collective"), _dump("data_loader")
    verdict = analyze_hang({0: waiting, 1: stuck, 2: waiting, 3: waiting})
    assert verdict.culprits == (1,)
    assert verdict.common_frame is not None and verdict.common_frame.name == "collective"
    assert "ranks 0,2,3 stuck at collective" in verdict.summary
    assert "likely culprit: rank 1" in verdict.summary


def test_all_ranks_at_the_same_frame_names_no_local_culprit():
    waiting = _dump("collective")
    verdict = analyze_hang({0: waiting, 1: waiting})
    assert verdict.culprits == ()
    assert "no local rank stands out" in verdict.summary


def test_missing_dumps_and_ties():
    text = 'Current thread 0x1 (most recent call first):\n  File "/a/t.py", line 3 in f\n'
    other = 'Current thread 0x2 (most recent call first):\n  File "/a/t.py", line 9 in g\n'
    verdict = analyze_hang({0: text, 1: other, 2: None, 3: ""})
    assert verdict.no_dump == (2, 3)
    assert verdict.culprits == ()
    assert "every rank stopped at a different frame" in verdict.summary
    assert "no stack dump from ranks 2,3" in verdict.summary
    assert analyze_hang({}).summary == "hang verdict: no stack dumps"


def test_single_dump_and_garbage():
    verdict = analyze_hang({5: "garbage\nnot a dump", 6: None})
    assert verdict.no_dump == (5, 6)
    one = 'Stack (most recent call first):\n  File "/x/y.py", line 7 in step\n'
    only = analyze_hang({3: one})
    assert only.by_frame == {Frame("/x/y.py", 7, "step"): (3,)}
    assert only.summary == "hang verdict: rank 3 stuck at step (y.py:7)"


def _frame_dump(path: str, line: int, name: str) -> str:
    return (
        "Current thread 0x1 (most recent call first):\n"
        f'  File "{path}", line {line} in {name}\n'
        '  File "/job/train.py", line 40 in <module>\n'
    )


def test_two_ranks_the_one_outside_any_collective_is_the_culprit():
    backward = _frame_dump("/v/site-packages/torch/autograd/graph.py", 829, "_engine_run_backward")
    asleep = _frame_dump("/job/train.py", 18, "sleeper")
    verdict = analyze_hang({0: backward, 1: asleep})
    assert verdict.culprits == (1,)
    assert verdict.common_frame is not None and verdict.common_frame.waits_for_peers
    assert verdict.summary == (
        "hang verdict: rank 0 stuck at _engine_run_backward (graph.py:829); "
        "rank 1 elsewhere at sleeper (train.py:18) -> likely culprit: rank 1"
    )


def test_waiting_in_a_collective_beats_the_majority():
    # Two ranks stuck in the same user code, one waiting in an all-reduce for them.
    reduce = _frame_dump("/v/torch/distributed/distributed_c10d.py", 2800, "all_reduce")
    loader = _frame_dump("/job/data.py", 7, "next_batch")
    verdict = analyze_hang({0: loader, 1: reduce, 2: loader, 3: None})
    assert verdict.culprits == (0, 2)
    assert verdict.no_dump == (3,)
    assert "likely culprit: ranks 0,2; no stack dump from rank 3" in verdict.summary


def _dump_in(path: Path, function: str) -> str:
    """A real faulthandler dump of a process stopped in ``function`` defined in file ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        f"import faulthandler, sys\n"
        f"def {function}():\n"
        f"    faulthandler.dump_traceback(file=sys.stdout, all_threads=True)\n"
    )
    code = textwrap.dedent(
        f"""
        import importlib.util
        spec = importlib.util.spec_from_file_location("m", {str(path)!r})
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        module.{function}()
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=30, check=True
    )
    return proc.stdout


@pytest.fixture(scope="module")
def real_dumps(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Real dumps: waiting in a (stand-in) torch.distributed all_reduce, and reading a file."""
    root = tmp_path_factory.mktemp("dumps")
    return {
        "all_reduce": _dump_in(root / "site/torch/distributed/c10d.py", "all_reduce"),
        "read": _dump_in(root / "job/data.py", "read_shard"),
    }


def test_a_rank_without_a_dump_while_every_dumped_rank_waits_is_the_culprit(real_dumps):
    # Rank 1 is stopped (SIGSTOP) or stuck in the kernel: it wrote nothing.
    verdict = analyze_hang({0: real_dumps["all_reduce"], 1: None, 2: real_dumps["all_reduce"]})
    assert verdict.culprits == (1,)
    assert verdict.common_frame is not None and verdict.common_frame.name == "all_reduce"
    assert verdict.summary == (
        "hang verdict: ranks 0,2 stuck at all_reduce (c10d.py:3); no stack dump from rank 1 "
        "-> likely culprit: rank 1"
    )


def test_a_missing_dump_names_no_culprit_when_no_dumped_rank_waits(real_dumps):
    verdict = analyze_hang({0: real_dumps["read"], 1: None})
    assert verdict.culprits == ()
    assert verdict.summary == (
        "hang verdict: rank 0 stuck at read_shard (data.py:3); no stack dump from rank 1"
    )


def test_job_wide_names_the_node_whose_ranks_are_elsewhere(real_dumps):
    # Node 0's ranks wait in the all-reduce; every rank of node 1 reads from a stalled file
    # system. Each node alone looks uniform; only the job-wide view names node 1.
    dumps = {0: real_dumps["all_reduce"], 1: real_dumps["all_reduce"]}
    dumps |= {2: real_dumps["read"], 3: real_dumps["read"]}
    nodes = {0: 0, 1: 0, 2: 1, 3: 1}
    for node in (0, 1):
        local = analyze_hang({r: d for r, d in dumps.items() if nodes[r] == node})
        assert local.culprits == () and "no local rank stands out" in local.summary
    frames = {rank: innermost_frame(text) for rank, text in dumps.items()}
    verdict = judge_frames(frames, nodes, label="job-wide hang verdict")
    assert verdict.culprits == (2, 3)
    assert verdict.nodes == nodes
    assert verdict.summary == (
        "job-wide hang verdict: ranks 0,1 stuck at all_reduce (c10d.py:3); ranks 2,3 elsewhere "
        "at read_shard (data.py:3) -> likely culprit: ranks 2,3 (node 1)"
    )


def test_job_wide_stopped_rank_on_another_node(real_dumps):
    frames = {0: innermost_frame(real_dumps["all_reduce"]), 1: innermost_frame(None)}
    verdict = judge_frames(frames, {0: 0, 1: 1}, label="job-wide hang verdict")
    assert verdict.culprits == (1,)
    assert verdict.summary.endswith("no stack dump from rank 1 -> likely culprit: rank 1 (node 1)")


def test_job_wide_all_waiting_points_below_python(real_dumps):
    frame = innermost_frame(real_dumps["all_reduce"])
    verdict = judge_frames({0: frame, 1: frame}, {0: 0, 1: 1}, label="job-wide hang verdict")
    assert verdict.culprits == ()
    assert "no rank of the job stands out (look below Python)" in verdict.summary


def test_culprit_cause_names_the_node_and_a_missing_dump(real_dumps):
    frames = {0: innermost_frame(real_dumps["all_reduce"]), 1: None}
    verdict = judge_frames(frames, {0: 0, 1: 1}, label="job-wide hang verdict")
    # Seen from node 0 (rank 0 is local there) and from node 1 (rank 1 is).
    assert culprit_cause(verdict, {0: 0}, {0: 11}) == (
        "likely culprit of the hang: rank 1 (node 1) with no stack dump (stopped, stuck in the "
        "kernel or gone), while rank 0 waited at all_reduce (c10d.py:3)"
    )
    cause = culprit_cause(verdict, {0: 1}, {0: 22})
    assert cause is not None and cause.startswith(
        "likely culprit of the hang: rank 1 (node 1, local rank 0, pid 22) with no stack dump"
    )


def test_ranks_in_the_emergency_checkpoints_agreement_wait_for_the_rank_without_a_dump():
    # The scored run (issue 28): rank 0 SIGSTOPped; ranks 1-3 waited in the emergency
    # checkpoint's per-step agreement, and no rank was named (all at the same frame).
    agreement = Frame(
        "/venv/lib/python3.11/site-packages/resiliency/checkpoint/_emergency/agreement.py",
        172,
        "poll",
    )
    verdict = judge_frames({0: None, 1: agreement, 2: agreement, 3: agreement}, {}, label="v")
    assert verdict.culprits == (0,), verdict.summary
