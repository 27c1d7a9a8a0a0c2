"""A wrapped call warns when the application has not configured logging (NVRx's wrapper does),
and leaves the loggers as they were."""

from __future__ import annotations

import contextlib
import logging
import warnings
from collections.abc import Iterator

import pytest
import torch.distributed as dist

from resiliency import inprocess


@contextlib.contextmanager
def no_root_handlers() -> Iterator[None]:
    """The root logger as an application that never configured logging leaves it: pytest's
    capture handlers, which it adds for each phase of a test, are taken off, then put back."""
    root = logging.getLogger()
    handlers = root.handlers[:]
    for handler in handlers:
        root.removeHandler(handler)
    try:
        yield
    finally:
        for handler in root.handlers[:]:
            root.removeHandler(handler)
        for handler in handlers:
            root.addHandler(handler)


def test_unconfigured_logging_is_a_user_warning_and_nothing_is_added(
    one_rank: dist.HashStore,
) -> None:
    @inprocess.Wrapper(store_factory=lambda: one_rank)
    def train() -> int:
        return 7

    with no_root_handlers():
        with pytest.warns(UserWarning, match=r"logging is not configured.*logging\.basicConfig"):
            assert train() == 7
        assert logging.getLogger(inprocess.wrap.__name__).handlers == []
        assert logging.getLogger().handlers == []


def test_configured_logging_gives_no_warning(one_rank: dist.HashStore) -> None:
    @inprocess.Wrapper(store_factory=lambda: one_rank)
    def train() -> int:
        return 7

    with no_root_handlers(), warnings.catch_warnings():
        logging.getLogger().addHandler(logging.NullHandler())  # any handler: the application's
        warnings.simplefilter("error")
        assert train() == 7
