"""Hang verdicts from faulthandler dumps: real dumps of real threads, and parsed text."""

from __future__ import annotations

import subprocess
import sys
import textwrap

from resiliency.launcher.verdict import Frame, analyze_hang, parse_stack_dump


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
