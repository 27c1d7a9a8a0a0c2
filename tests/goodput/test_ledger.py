"""The ledger reader: every malformed input gives a warning with its line, the rest is computed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from resiliency.goodput import Recorder, compute, read_ledger

from ._ledgers import MIN, line, worked_example, write


def _with_bad_lines(tmp_path: Path, bad: list[str], tail: str = "") -> tuple[Path, list[int]]:
    """The worked example with ``bad`` lines inserted after its 4th line; their line numbers."""
    good = [json.dumps(x) for x in worked_example()]
    text = good[:4] + bad + good[4:]
    path = tmp_path / "node0.jsonl"
    path.write_text("\n".join(text) + "\n" + tail, encoding="utf-8")
    return path, [5 + i for i in range(len(bad))]


def _still_exact(path: Path) -> None:
    report = compute(read_ledger([path]), "auto")
    assert report.whole.goodput == 0.5
    assert report.whole.seconds["lost_progress"] == 40 * MIN
    assert report.whole.seconds["slowdown"] == 25 * MIN


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ('{"schema": 1, "job": "job", "event": "step", "time"', "malformed line"),
        ("not json at all", "malformed line"),
        ("[1, 2, 3]", "not a JSON object"),
        (json.dumps(line("teleported", 3)), "unknown event type 'teleported'"),
        (json.dumps({**line("step", 3, step=1), "schema": 2}), "schema version 2 is newer"),
        (json.dumps(line("checkpoint_saved", 3, step="x")), "field 'step' must be int"),
        (
            json.dumps({k: v for k, v in line("job_started", 3).items() if k != "mono"}),
            "missing field 'mono'",
        ),
        (json.dumps({**line("job_started", 3), "time": "yesterday"}), "not an ISO 8601 time"),
        (json.dumps({**line("job_started", 3), "time": "2026-11-23T00:03:00"}), "time zone"),
    ],
    ids=[
        "cut",
        "text",
        "array",
        "unknown-type",
        "newer-schema",
        "bad-field",
        "missing-field",
        "bad-time",
        "naive-time",
    ],
)
def test_a_bad_line_is_named_with_its_line_number_and_skipped(
    tmp_path: Path, bad: str, message: str
) -> None:
    path, numbers = _with_bad_lines(tmp_path, [bad])
    ledger = read_ledger([path])
    assert len(ledger.warnings) == 1, ledger.warnings
    assert ledger.warnings[0].startswith(f"{path}:{numbers[0]}: ")
    assert message in ledger.warnings[0]
    _still_exact(path)


def test_truncated_last_line(tmp_path: Path) -> None:
    path, _ = _with_bad_lines(tmp_path, [], tail='{"schema":1,"job":"job","event":"st')
    ledger = read_ledger([path])
    last = len(path.read_text().splitlines())
    assert ledger.warnings == [f"{path}:{last}: truncated last line (no newline; 35 bytes) skipped"]
    _still_exact(path)


def test_a_complete_last_line_without_newline_is_read(tmp_path: Path) -> None:
    text = "\n".join(json.dumps(x) for x in worked_example())
    path = tmp_path / "n.jsonl"
    path.write_text(text, encoding="utf-8")
    assert not read_ledger([path]).warnings
    _still_exact(path)


def test_many_problems_are_capped_per_file(tmp_path: Path) -> None:
    path, _ = _with_bad_lines(tmp_path, ["garbage"] * 30)
    warnings = read_ledger([path]).warnings
    assert len(warnings) == 21 and warnings[-1].endswith("more problems; not shown")
    _still_exact(path)


def test_node_files_are_merged_by_wall_time(tmp_path: Path) -> None:
    lines = worked_example()
    launcher = [x for x in lines if x["rank"] is None]
    rank0 = [x for x in lines if x["rank"] is not None]
    write(tmp_path / "job.node-b.jsonl", list(reversed(rank0)))  # any order within a file
    write(tmp_path / "job.node-a.jsonl", launcher)
    ledger = read_ledger([tmp_path])
    assert len(ledger.files) == 2 and not ledger.warnings
    times = [e.time for e in ledger.events]
    assert times == sorted(times)
    _still_exact(tmp_path)


def test_clocks_out_of_order_across_nodes(tmp_path: Path) -> None:
    lines = worked_example()
    write(tmp_path / "job.a.jsonl", [x for x in lines if x["rank"] is None])
    # Node b's clock is 10 minutes behind: its events of attempt 1 predate that cycle's start.
    skewed = [
        line(
            "checkpoint_loaded",
            106,
            node="1",
            rank=1,
            attempt=1,
            step=50,
            tier="persistent",
            bytes=1,
            duration_s=60.0,
        )
    ]
    write(tmp_path / "job.b.jsonl", skewed)
    ledger = read_ledger([tmp_path])
    assert len(ledger.warnings) == 1, ledger.warnings
    warning = ledger.warnings[0]
    assert warning.startswith(f"{tmp_path / 'job.b.jsonl'}:1: clocks out of order across nodes")
    assert "540.0 s before" in warning and "job.a.jsonl:" in warning
    assert compute(ledger).whole.total == 200 * MIN  # still computed


def test_several_jobs_are_named(tmp_path: Path) -> None:
    write(tmp_path / "a.jsonl", worked_example())
    write(tmp_path / "b.jsonl", [line("job_started", 1, job="other")])
    warnings = read_ledger([tmp_path]).warnings
    assert any("several jobs (job, other)" in w for w in warnings)


def test_progress_callback_reaches_the_total(tmp_path: Path) -> None:
    path = write(tmp_path / "a.jsonl", worked_example(dense=True))
    seen: list[tuple[int, int]] = []
    read_ledger([path], progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1] == path.stat().st_size


def test_incremental_reading_parses_only_what_was_appended(tmp_path: Path) -> None:
    from resiliency.goodput import LedgerReader  # noqa: PLC0415

    lines = [json.dumps(x) + "\n" for x in worked_example(dense=True)]
    path = tmp_path / "n.jsonl"
    path.write_text("".join(lines[:30]) + lines[30][:20], encoding="utf-8")  # a line half written
    reader = LedgerReader([tmp_path])
    first = reader.update()
    assert not first.warnings  # the half-written line waits for the next update
    assert first.lines == 30
    with path.open("a", encoding="utf-8") as stream:
        stream.write(lines[30][20:] + "".join(lines[31:]))
    second = reader.update()
    assert second.lines == len(lines) and not second.warnings
    full = read_ledger([path])
    assert second.steps == full.steps
    assert [(e.time, e.event) for e in second.events] == [(e.time, e.event) for e in full.events]
    assert compute(second).whole.seconds == compute(full).whole.seconds
    assert reader.update().lines == len(lines)  # nothing new: nothing read twice
    assert len(reader.update().steps) == len(full.steps)


def _mixed_ledger(directory: Path) -> Path:
    """The recorder's own step lines, blocks of them, with bad and other lines in between."""
    recorder = Recorder(directory, job="j", rank=0, step_interval_s=0.0)
    for n in range(1, 30001):
        recorder.step(n)
        if n % 7000 == 0:
            recorder.emit("checkpoint_saved", step=n, tier="local", bytes=1, blocked_s=0, total_s=0)
    recorder.close()
    assert recorder.path is not None
    lines = recorder.path.read_bytes().splitlines(keepends=True)
    lines.insert(12000, b'{"schema":1,"job":"j","event":"step" oops\n')
    lines.insert(20000, b'{"schema":1,"job":"j","event":"step","step":"x"}\n')
    recorder.path.write_bytes(b"".join(lines))
    return recorder.path


def test_step_lines_read_in_worker_processes_give_the_same_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from resiliency.goodput import ledger as ledger_module  # noqa: PLC0415

    path = _mixed_ledger(tmp_path)
    serial = read_ledger([path])
    monkeypatch.setattr(ledger_module, "BLOCK_BYTES", 64 << 10)  # many blocks
    monkeypatch.setattr(ledger_module, "parallel_workers", lambda nbytes: 2)
    parallel = read_ledger([path])
    assert len(serial.steps) == 30000
    assert parallel.steps == serial.steps
    assert [(e.event, e.line) for e in parallel.events] == [
        (e.event, e.line) for e in serial.events
    ]
    assert parallel.warnings == serial.warnings
    assert [w.split(": ", 1)[0].rsplit(":", 1)[1] for w in serial.warnings] == ["12001", "20001"]
