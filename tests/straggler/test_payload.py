"""The exchanged summary schema: round trip, validation, malformed peers dropped."""

from __future__ import annotations

import logging
import struct

import pytest

from resiliency.straggler import ExchangeError, Report
from resiliency.straggler._aggregate import decode_all, fill_scores
from resiliency.straggler._payload import RankSummary, decode_summary, encode_summary


def _summary(rank: int, median: float) -> RankSummary:
    return RankSummary(
        rank=rank,
        node=f"n{rank}",
        section_medians={"fwd": median},
        kernel_medians={"gemm": (median, 4)},
        section_individual={"fwd": 1.0},
        gpu_individual=1.0,
    )


def test_round_trip() -> None:
    original = _summary(7, 12.5)
    assert decode_summary(encode_summary(original)) == original
    assert decode_summary(GOOD) == RankSummary(3, "n", {"fwd": 1.0})


def test_ranks_with_different_sections_are_scored_together() -> None:
    a = RankSummary(0, "a", {"fwd": 10.0, "data": 1.0}, section_individual={"fwd": 0.5})
    b = RankSummary(1, "b", {"fwd": 20.0}, {"k": (5.0, 2)}, gpu_individual=0.9)
    report = Report()
    fill_scores(
        report,
        decode_all([encode_summary(a), encode_summary(b)], receiver_rank=0),
        relative=True,
        individual=True,
    )
    assert report.section_relative_perf_scores == {"fwd": {0: 1.0, 1: 0.5}, "data": {0: 1.0}}
    assert report.section_individual_perf_scores == {"fwd": {0: 0.5}}
    assert report.gpu_relative_perf_scores == {1: 1.0}
    assert report.gpu_individual_perf_scores == {1: 0.9}


def _frame(
    names: bytes = b'[["fwd"],[],[]]',
    floats: tuple = (1.0,),
    counts: tuple = (),
    version: int = 1,
    has_gpu: int = 0,
    node: bytes = b"n",
    magic: bytes = b"RSTS",
) -> bytes:
    header = struct.pack("<4sHIBHI", magic, version, 3, has_gpu, len(node), len(names))
    packed = struct.pack(f"<{len(floats)}d", *floats) + struct.pack(f"<{len(counts)}q", *counts)
    return header + node + names + packed


GOOD = _frame()


@pytest.mark.parametrize(
    ("data", "message"),
    [
        (b"\x00" * 5, "shorter than its header"),
        (_frame(magic=b"JUNK"), "frame marker"),
        (_frame(version=2), "payload version 2"),
        (_frame(has_gpu=7), "GPU flag"),
        (_frame(node=b"\xff"), "not UTF-8"),
        (_frame(names=b"[oops"), "not valid JSON"),
        (_frame(names=b'[["a"],[]]'), "three lists"),
        (_frame(names=b"[[1],[],[]]"), "list of strings"),
        (_frame(names=b'[["a","a"],[],[]]', floats=(1.0, 1.0)), "repeat a name"),
        (GOOD + b"\x00", "header implies"),
        (GOOD[:-1], "header implies"),
        (_frame(floats=(float("nan"),)), "not finite"),
        (_frame(floats=(float("inf"),)), "not finite"),
        (_frame(names=b'[[],["k"],[]]', floats=(1.0,), counts=(-1,)), "negative"),
    ],
)
def test_malformed_summaries_are_refused(data: bytes, message: str) -> None:
    with pytest.raises(ExchangeError, match=message):
        decode_summary(data)


def test_a_malformed_peer_is_logged_and_left_out(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.ERROR)
    payloads = [encode_summary(_summary(0, 10.0)), b"garbage", encode_summary(_summary(2, 20.0))]
    report = Report()
    fill_scores(report, decode_all(payloads, receiver_rank=0), relative=True, individual=True)
    assert report.section_relative_perf_scores == {"fwd": {0: 1.0, 2: 0.5}}
    assert report.gpu_relative_perf_scores == {0: 1.0, 2: 0.5}
    assert report.rank_to_node == {0: "n0", 2: "n2"}
    assert "group member 1 is dropped" in caplog.text


def test_fill_scores_for_one_rank_keeps_only_its_entries() -> None:
    report = Report()
    payloads = [encode_summary(_summary(0, 10.0)), encode_summary(_summary(1, 40.0))]
    gathered = decode_all(payloads, receiver_rank=1)
    fill_scores(report, gathered, relative=True, individual=True, only_rank=1)
    assert report.section_relative_perf_scores == {"fwd": {1: 0.25}}
    assert report.gpu_relative_perf_scores == {1: 0.25}
    assert report.section_individual_perf_scores == {"fwd": {1: 1.0}}
    assert report.rank_to_node == {1: "n1"}
