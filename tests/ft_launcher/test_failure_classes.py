"""The failure-class table, row by row, on plain evidence (issue 28).

The end-to-end runs (real launcher, real ranks) are in test_diagnosis_stop.py; these check every
row of the table, including the cases where one row must win over another.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from resiliency.launcher._failure_evidence import (
    cycle_evidence,
    oom_kill_count,
    parse_error_message,
)
from resiliency.launcher.failure_classes import (
    RULES,
    CycleEvidence,
    FailureClass,
    RankEvidence,
    classify,
)
from resiliency.launcher.verdict import Frame, judge_frames

TERM, KILL = -int(signal.SIGTERM), -int(signal.SIGKILL)
COLLECTIVE = "/venv/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py"


def _crash(rank: int, exc: str, message: str, node: int = 0) -> RankEvidence:
    return RankEvidence(rank=rank, node=node, exitcode=1, exc_type=exc, message=message)


def _stopped(rank: int, node: int = 0) -> RankEvidence:
    return RankEvidence(rank=rank, node=node, exitcode=TERM)


def _ev(*ranks: RankEvidence, **kw) -> CycleEvidence:
    return CycleEvidence(
        node=kw.pop("node", 0), attempt=kw.pop("attempt", 1), ranks={r.rank: r for r in ranks}, **kw
    )


def test_an_exception_is_a_crash_of_the_rank_that_raised_not_of_the_stopped_ones():
    verdict = classify(_ev(_stopped(0), _crash(1, "ValueError", "bad batch at step 3")))
    assert verdict.cls is FailureClass.CRASH
    assert verdict.culprit_ranks == (1,) and verdict.culprit_nodes == (0,)
    assert verdict.cause == "ValueError: bad batch at step 3"
    assert verdict.evidence["ranks"] == [
        {
            "rank": 1,
            "node": 0,
            "exitcode": 1,
            "exc_type": "ValueError",
            "message": "bad batch at step 3",
        }
    ]


@pytest.mark.parametrize(
    ("rank", "cls"),
    [
        (_crash(1, "OutOfMemoryError", "CUDA out of memory. Tried to allocate 2.00 GiB"), "oom"),
        (_crash(1, "RuntimeError", "CUDA out of memory."), "oom"),
        (_crash(1, "MemoryError", ""), "oom"),
        (_crash(1, "ModuleNotFoundError", "No module named 'apex'"), "config"),
        (_crash(1, "ImportError", "cannot import name 'x'"), "config"),
        (_crash(1, "CheckpointConfigError", "rank 1 cannot write /ckpt"), "config"),
        (RankEvidence(rank=1, node=0, exitcode=78), "config"),
        (_crash(1, "FloatingPointError", "overflow"), "nan_inf"),
        (_crash(1, "RuntimeError", "loss is nan at step 120"), "nan_inf"),
        (_crash(1, "ValueError", "non-finite loss at step 9"), "nan_inf"),
        (
            _crash(1, "RuntimeError", "CUDA error: uncorrectable ECC error encountered"),
            "gpu_hardware",
        ),
        (_crash(1, "RuntimeError", "NCCL error: unhandled system error (Xid 79)"), "gpu_hardware"),
        (RankEvidence(rank=1, node=0, exitcode=-int(signal.SIGSEGV)), "signal"),
        (RankEvidence(rank=1, node=0, exitcode=7), "crash"),
    ],
)
def test_each_row_of_the_table(rank: RankEvidence, cls: str):
    verdict = classify(_ev(_stopped(0), rank))
    assert verdict.cls.value == cls, verdict
    assert verdict.culprit_ranks == (1,)


def test_a_nan_in_a_message_without_a_loss_is_a_plain_crash():
    assert classify(_ev(_crash(1, "ValueError", "column 'nan' unknown"))).cls is FailureClass.CRASH


def test_sigkill_is_an_oom_kill_only_when_the_kernel_counted_one():
    killed = RankEvidence(rank=1, node=0, exitcode=KILL)
    assert classify(_ev(_stopped(0), killed, oom_kills=1)).cls is FailureClass.OOM
    assert classify(_ev(_stopped(0), killed)).cls is FailureClass.SIGNAL


def test_every_rank_stopped_blames_them_all():
    verdict = classify(_ev(_stopped(0), _stopped(1)))
    assert verdict.cls is FailureClass.SIGNAL and verdict.culprit_ranks == (0, 1)


def test_a_failed_gpu_health_check_is_gpu_hardware_of_the_node():
    verdict = classify(_ev(_stopped(0), health=("nvml: GPU 1: 3 uncorrectable ECC errors",)))
    assert verdict.cls is FailureClass.GPU_HARDWARE
    assert verdict.culprit_ranks == () and verdict.culprit_nodes == (0,)


def test_preemption_wins_and_names_the_preempted_node_not_a_rank():
    verdict = classify(_ev(_stopped(0), preempted="saved step 40"))
    assert verdict.cls is FailureClass.PREEMPTION
    assert verdict.culprit_ranks == () and verdict.culprit_nodes == (0,)
    elsewhere = classify(_ev(_stopped(0), preempted="node 1: SIGTERM", preempted_nodes=(1,)))
    assert (elsewhere.cls, elsewhere.culprit_nodes) == (FailureClass.PREEMPTION, (1,))


def test_nothing_failed_here_is_unknown():
    assert classify(_ev()).cls is FailureClass.UNKNOWN


def _hang(frames: dict[int, Frame | None], nodes: dict[int, int]) -> CycleEvidence:
    """The evidence of a hang judged job-wide from every rank's innermost frame."""
    return cycle_evidence(
        node=0, attempt=0, failures={}, hangs={}, verdict=judge_frames(frames, nodes)
    )


WAIT = Frame(COLLECTIVE, 3900, "all_reduce")


def test_hang_in_a_read_on_another_node_names_that_node():
    # Issue 28's case: node 1's ranks all read from the file system while node 0's wait in an
    # all-reduce; node 1 agrees with itself, only the job-wide view names it.
    read = Frame("/data/loader/shards.py", 88, "read")
    verdict = classify(_hang({0: WAIT, 1: WAIT, 2: read, 3: read}, {0: 0, 1: 0, 2: 1, 3: 1}))
    assert verdict.cls is FailureClass.HANG_IO
    assert verdict.culprit_ranks == (2, 3) and verdict.culprit_nodes == (1,)
    assert verdict.cause == "hung at read (shards.py:88)"


def test_hang_in_a_data_loader_and_in_checkpoint_code():
    loader = Frame("/venv/torch/utils/data/dataloader.py", 1100, "_get_data")
    ckpt = Frame("/venv/torch/distributed/checkpoint/state_dict_saver.py", 150, "save")
    nodes = {0: 0, 1: 0}
    assert classify(_hang({0: WAIT, 1: loader}, nodes)).cls is FailureClass.HANG_IO
    # torch.distributed.checkpoint is checkpoint code before it is a collective.
    assert classify(_hang({0: WAIT, 1: ckpt}, nodes)).cls is FailureClass.HANG_CHECKPOINT


def test_hang_in_a_section_named_like_a_checkpoint_without_a_dump():
    hung = RankEvidence(rank=0, node=0, timer="section:checkpoint_save", hung=True)
    assert classify(_ev(hung)).cls is FailureClass.HANG_CHECKPOINT


def test_every_rank_in_the_same_collective_is_a_collective_hang():
    verdict = classify(_hang({0: WAIT, 1: WAIT}, {0: 0, 1: 0}))
    assert verdict.cls is FailureClass.HANG_COLLECTIVE


def test_a_stopped_rank_that_the_others_wait_for_is_a_plain_hang():
    verdict = classify(_hang({0: WAIT, 1: None}, {0: 0, 1: 1}))
    assert verdict.cls is FailureClass.HANG
    assert verdict.culprit_ranks == (1,) and verdict.culprit_nodes == (1,)
    assert "no stack dump" in verdict.cause


def test_the_table_has_one_row_per_class_of_the_issue():
    classes = {rule.cls.value for rule in RULES}
    assert classes == {c.value for c in FailureClass} - {"unknown"}


def test_parse_error_message():
    assert parse_error_message("ValueError: bad\nmore") == ("ValueError", "bad")
    assert parse_error_message("torch.OutOfMemoryError: CUDA out of memory") == (
        "OutOfMemoryError",
        "CUDA out of memory",
    )
    assert parse_error_message("KeyboardInterrupt") == ("KeyboardInterrupt", None)
    assert parse_error_message("To enable traceback see: https://x") == (None, None)
    assert parse_error_message(None) == (None, None)


def test_oom_kill_count_reads_the_cgroup_counter(tmp_path: Path):
    own = Path("/proc/self/cgroup").read_text().splitlines()
    path = next((line.split("::", 1)[1] for line in own if line.startswith("0::")), None)
    if path is None:
        pytest.skip("no cgroup v2 on this machine")
    events = tmp_path / path.lstrip("/") / "memory.events"
    events.parent.mkdir(parents=True, exist_ok=True)
    events.write_text("low 0\nhigh 0\nmax 2\noom 2\noom_kill 2\n")
    assert oom_kill_count(tmp_path) == 2
    events.write_text("garbage")
    assert oom_kill_count(tmp_path) is None
    assert oom_kill_count(tmp_path / "absent") is None


def test_a_user_function_named_like_a_read_is_io_other_user_code_a_plain_hang():
    nodes = {0: 0, 1: 1}
    read = Frame("/app/train.py", 41, "read_shard")
    assert classify(_hang({0: WAIT, 1: read}, nodes)).cls is FailureClass.HANG_IO
    step = Frame("/app/train.py", 80, "train_step")
    assert classify(_hang({0: WAIT, 1: step}, nodes)).cls is FailureClass.HANG


def test_a_rank_the_launcher_signalled_is_never_the_culprit():
    term = RankEvidence(rank=0, node=0, exitcode=TERM, stopped_by_launcher=True)
    kill = RankEvidence(rank=1, node=0, exitcode=KILL, stopped_by_launcher=False)
    verdict = classify(_ev(term, kill))
    assert verdict.cls is FailureClass.SIGNAL
    assert verdict.culprit_ranks == (1,) and verdict.cause == "killed by SIGKILL"
    # Every rank stopped by the launcher: nothing failed here (another node did).
    other = RankEvidence(rank=1, node=0, exitcode=TERM, stopped_by_launcher=True)
    both = classify(_ev(term, other))
    assert both.cls is FailureClass.UNKNOWN


def test_a_rank_that_lost_its_peer_in_a_collective_waited_for_it():
    lost = RankEvidence(
        rank=0,
        node=0,
        exitcode=1,
        exc_type="RuntimeError",
        message="[../gloo/transport/tcp/pair.cc:534] Connection closed by peer [127.0.0.1]:4242",
        stopped_by_launcher=False,
    )
    kill = RankEvidence(rank=1, node=0, exitcode=KILL, stopped_by_launcher=False)
    verdict = classify(_ev(lost, kill))
    assert (verdict.cls, verdict.culprit_ranks) == (FailureClass.SIGNAL, (1,))
    # Alone, it is what this node knows: a crash of that rank.
    alone = classify(_ev(lost))
    assert (alone.cls, alone.culprit_ranks) == (FailureClass.CRASH, (0,))
