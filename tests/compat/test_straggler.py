"""The straggler ``Detector`` as a user of NVIDIA's resiliency extension (NVRx) 0.4.1 uses it,
after changing only the import (``nvidia_resiliency_ext.straggler`` -> ``resiliency.straggler``).

Written from NVRx's documented API: ``Detector.initialize(scores_to_compute, gather_on_rank0,
profiling_interval, report_time_interval, node_name)``, ``detection_section(name, profile_cuda)``,
``wrap_callables(callable_ids, profile_cuda)``, ``CallableId(obj, name, arg_filter_fn,
extra_args_fn, ignored_args)``, ``generate_report()``, ``generate_report_if_interval_elapsed()``,
``is_interval_elapsed()`` and ``Report`` with ``Statistic``-keyed summaries in milliseconds.

Needs the straggler package only (no torch; CUDA profiling is turned off with
``profile_cuda=False``); the part that needs ``torch.distributed`` is skipped without torch.
Runs in the ``straggler`` nox session.
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import textwrap
import time
import types
from pathlib import Path

import pytest

from resiliency.straggler import CallableId, Detector, Report, Statistic


@pytest.fixture(autouse=True)
def _fresh_detector():
    yield
    Detector.shutdown()


class Model:
    def forward(self, x):
        time.sleep(0.002)
        return x


def test_statistic_members():
    assert [s.name for s in Statistic] == ["MIN", "MAX", "MED", "AVG", "STD", "NUM"]
    assert str(Statistic.MED) == "MED"


def test_section_summaries_are_keyed_by_statistic_in_milliseconds():
    Detector.initialize(
        scores_to_compute="all",
        gather_on_rank0=True,
        profiling_interval=1,
        report_time_interval=60,
        node_name="node0",
    )
    for _ in range(5):
        with Detector.detection_section("step", profile_cuda=False):
            time.sleep(0.02)
    report = Detector.generate_report()
    assert isinstance(report, Report)
    stats = report.local_section_summaries["step"]
    assert set(stats) == set(Statistic)
    assert stats[Statistic.NUM] == 5
    assert 15.0 <= stats[Statistic.MIN] <= stats[Statistic.MED] <= stats[Statistic.MAX] < 2000.0
    assert 15.0 <= stats[Statistic.AVG] < 2000.0
    assert stats[Statistic.STD] >= 0.0
    assert isinstance(report.generate_report_elapsed_time, float)
    assert 0.0 <= report.generate_report_elapsed_time < 60_000.0  # milliseconds
    assert report.rank_to_node == {0: "node0"}
    assert report.gather_on_rank0 is True and report.rank == 0
    assert report.section_relative_perf_scores == {"step": {0: 1.0}}
    assert report.section_individual_perf_scores == {"step": {0: 1.0}}


def test_std_of_a_single_sample_is_nan():
    Detector.initialize(report_time_interval=60)
    with Detector.detection_section("once", profile_cuda=False):
        pass
    stats = Detector.generate_report().local_section_summaries["once"]
    assert stats[Statistic.NUM] == 1 and math.isnan(stats[Statistic.STD])


def test_identify_stragglers_keys_and_thresholds():
    Detector.initialize(report_time_interval=60)
    with Detector.detection_section("a", profile_cuda=False):
        pass
    report = Detector.generate_report()
    result = report.identify_stragglers(0.75, 0.75, 0.75, 0.75)
    assert set(result) == {
        "straggler_gpus_relative",
        "straggler_gpus_individual",
        "straggler_sections_relative",
        "straggler_sections_individual",
    }
    assert result["straggler_sections_relative"] == {}


def test_interval_elapsed_means_the_last_call_produced_a_report():
    Detector.initialize(report_time_interval=0.2)
    assert Detector.generate_report_if_interval_elapsed() is None
    assert Detector.is_interval_elapsed() is False
    time.sleep(0.25)  # the condition is the passing of time itself: the 0.2 s interval elapses
    with Detector.detection_section("s", profile_cuda=False):
        pass
    report = Detector.generate_report_if_interval_elapsed()
    assert report is not None
    assert Detector.is_interval_elapsed() is True
    assert Detector.is_interval_elapsed() is True  # asking again changes nothing
    assert Detector.generate_report_if_interval_elapsed() is None
    assert Detector.is_interval_elapsed() is False


def test_wrap_callables_names_and_profile_cuda():
    Detector.initialize(report_time_interval=60)
    module = types.ModuleType("my_data")
    module.load = lambda n: list(range(n))
    model = Model()
    Detector.wrap_callables(
        [
            CallableId(Model, "forward"),
            CallableId(
                module,
                "load",
                arg_filter_fn=lambda bound: True,
                extra_args_fn=lambda bound: {},
            ),
        ],
        profile_cuda=False,
    )
    model.forward(1)
    module.load(3)
    names = set(Detector.generate_report().local_section_summaries)
    assert names == {f"{__name__}.Model.forward", "my_data.load"}
    Detector.restore_original_callables()
    assert "forward" in vars(Model) and not hasattr(Model.forward, "__wrapped__")


def test_callable_id_fields_and_string():
    cid = CallableId(Model, "forward", None, None, ("x",))
    assert (cid.obj, cid.name, cid.arg_filter_fn, cid.extra_args_fn, cid.ignored_args) == (
        Model,
        "forward",
        None,
        None,
        ("x",),
    )
    assert str(cid) == f"{__name__}.Model.forward"
    assert str(CallableId(Model(), "forward")) == "Model.forward"
    assert str(CallableId(os.path, "join")) == f"{os.path.__name__}.join"


_RANK_SCRIPT = textwrap.dedent(
    """
    import json, sys
    from datetime import timedelta
    import torch.distributed as dist
    from resiliency.straggler import Detector, Statistic
    rank, port, out = int(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2, timeout=timedelta(seconds=60))
    # A clock the section advances itself: rank r's step lasts (r + 1) * 10 ms exactly, however
    # loaded the machine is (sleeps of 10 and 20 ms swapped order under a busy CI run).
    now = [0]
    Detector.initialize(gather_on_rank0=True, report_time_interval=60, clock=lambda: now[0])
    for _ in range(3):
        with Detector.detection_section("step", profile_cuda=False):
            now[0] += 10_000_000 * (1 + rank)
    report = Detector.generate_report()
    result = {"is_none": report is None}
    if report is not None:
        result["scores"] = {k: {str(r): v for r, v in d.items()}
                            for k, d in report.section_relative_perf_scores.items()}
        result["med"] = report.local_section_summaries["step"][Statistic.MED]
    Detector.shutdown()
    dist.destroy_process_group()
    open(out, "w").write(json.dumps(result))
    """
)


@pytest.mark.slow
def test_with_gather_on_rank0_other_ranks_get_none(tmp_path: Path):
    pytest.importorskip("torch")
    script = tmp_path / "rank.py"
    script.write_text(_RANK_SCRIPT)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, str(script), str(rank), str(port), str(tmp_path / f"{rank}.json")]
        )
        for rank in range(2)
    ]
    try:
        codes = [p.wait(120) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert codes == [0, 0]
    rank0 = json.loads((tmp_path / "0.json").read_text())
    rank1 = json.loads((tmp_path / "1.json").read_text())
    assert rank1 == {"is_none": True}
    assert rank0["is_none"] is False
    assert set(rank0["scores"]["step"]) == {"0", "1"}
    assert rank0["scores"]["step"] == {"0": 1.0, "1": 0.5}
    assert rank0["med"] == 10.0
