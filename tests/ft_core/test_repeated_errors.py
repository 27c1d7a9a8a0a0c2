"""A failure that repeats is logged once in full, then as one count a minute."""

from __future__ import annotations

import logging

import pytest

from resiliency.ft._repeated_errors import RepeatedErrorLog

log = logging.getLogger("test.repeated")


def _raise(n: int) -> None:
    raise RuntimeError(f"boom {n}")


def test_first_in_full_then_a_count_every_minute(caplog: pytest.LogCaptureFixture) -> None:
    errors = RepeatedErrorLog(log, "unexpected error in the monitor loop")
    with caplog.at_level(logging.ERROR, logger="test.repeated"):
        for n, now in enumerate([0.0, 0.05, 0.1, 30.0, 60.1, 60.2, 125.0]):
            try:
                _raise(n)
            except RuntimeError as exc:
                errors.report(exc, now=now)
    records = caplog.records
    assert len(records) == 3
    first, at_minute, at_two = records
    assert first.exc_info is not None and "boom 0" in str(first.exc_info[1])
    assert "4 more in the last minute (5 in total)" in at_minute.getMessage()
    assert "boom 4" in at_minute.getMessage() and at_minute.exc_info is None
    assert "2 more in the last minute (7 in total)" in at_two.getMessage()
    assert errors.total == 7
