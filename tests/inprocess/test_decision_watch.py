"""The restart barrier's waiters wake when the survivors are decided, not a poll later."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import torch.distributed as dist
from inprocess_harness import free_port_run

from resiliency.inprocess._decision_watch import DecisionWatch

LONG = 60.0  # a pause that only the key can cut short within this test's bounds


def _host() -> dist.TCPStore:
    return dist.TCPStore("127.0.0.1", free_port_run(), 1, True, timeout=timedelta(seconds=30))


def test_a_pause_ends_when_another_client_writes_the_key() -> None:
    host = _host()
    watch = DecisionWatch(host, "0/decided", timeout=LONG)
    writer = dist.TCPStore("127.0.0.1", host.port, 1, False, timeout=timedelta(seconds=30))
    timer = threading.Timer(0.2, writer.set, ("0/decided", "1,2"))
    timer.start()
    started = time.monotonic()
    watch.pause(LONG)
    assert time.monotonic() - started < LONG / 2, "the pause waited for its full length"
    timer.join()
    watch.join(LONG)
    del writer, host, timer  # the sockets close with the stores


def test_after_the_key_every_pause_sleeps_in_full() -> None:
    host = _host()
    host.set("3/decided", "0")
    watch = DecisionWatch(host, "3/decided", timeout=LONG)
    watch.pause(LONG)  # the key is there: at once
    started = time.monotonic()
    watch.pause(0.05)  # a barrier still waiting after it must not spin
    assert time.monotonic() - started >= 0.05
    watch.join(LONG)
    del host


class _NoClone:
    def clone(self) -> None:
        raise RuntimeError("this store cannot be cloned")


def test_a_store_that_cannot_be_watched_leaves_plain_sleeps() -> None:
    watch = DecisionWatch(_NoClone(), "0/decided", timeout=LONG)
    for _ in range(2):
        started = time.monotonic()
        watch.pause(0.05)
        assert time.monotonic() - started >= 0.05
