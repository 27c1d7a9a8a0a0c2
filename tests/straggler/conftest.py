"""Shared fixtures: a Detector shut down around every test; captured straggler logs."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest

from resiliency.straggler import Detector


@pytest.fixture(autouse=True)
def _clean_detector() -> Iterator[None]:
    Detector.shutdown()
    yield
    Detector.shutdown()


@pytest.fixture
def straggler_logs(caplog: pytest.LogCaptureFixture) -> pytest.LogCaptureFixture:
    caplog.set_level(logging.INFO, logger="resiliency.straggler")
    return caplog
