"""Fixtures for the Lightning callback tests (helpers live in ptl_harness.py)."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from lightning_flavour import ENV, MODULE
from ptl_harness import Jobs, Monitors


def pytest_report_header() -> str:
    """Say which Lightning the tests train with (see lightning_flavour.py)."""
    return f"Lightning flavour: {MODULE} ({ENV})"


@pytest.fixture
def jobs() -> Iterator[Jobs]:
    j = Jobs()
    try:
        yield j
    finally:
        j.kill_all()


@pytest.fixture
def short_tmp() -> Iterator[Path]:
    """A short private directory (AF_UNIX socket paths are limited to 107 bytes)."""
    path = Path(tempfile.mkdtemp(prefix="ptlft-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def monitors(short_tmp: Path) -> Iterator[Monitors]:
    m = Monitors(short_tmp)
    try:
        yield m
    finally:
        m.stop_all()
