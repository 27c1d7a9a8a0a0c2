"""Store load of ft-launcher's cross-node coordination, against torchrun's own, at N nodes.

N simulated node agents (threads, one store connection each, plus what they open themselves)
join one real c10d rendezvous on one TCPStore, through a relay that counts every request
each connection sends. Then, per setup, the agents supervise for a fixed window and finish
through an exit barrier, and the relay tells how many requests each node sent per second:

* ``torchrun``: torch's rendezvous handler only (``num_nodes_waiting()`` every monitoring
  interval, its keep-alive thread), and torch's own exit barrier (``store_util.barrier``);
* ``ft-polling``: the pattern ft-launcher used before: on top of torchrun's, one store read
  of the round's state every monitoring interval, and an exit barrier that polled the
  round's counters every 50 ms;
* ``ft-launcher``: the current code: :class:`RoundWatcher` (one blocking pop per node) and
  the blocking exit barrier of :mod:`resiliency.launcher._coordination`.

A request is what a client sends between two answers of the store (a ``set`` followed by a
``get`` counts as one when the ``set`` is not answered); bytes are counted exactly.

    python benchmarks/bench_store_load.py                      # N = 8, 64, 256
    python benchmarks/bench_store_load.py --nodes 8 --window 5 --results DIR
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import selectors
import socket
import sys
import threading
import time
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist
from torch.distributed.elastic.rendezvous.c10d_rendezvous_backend import C10dRendezvousBackend
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import (
    DynamicRendezvousHandler,
    RendezvousTimeout,
)
from torch.distributed.elastic.utils import store as store_util

from resiliency.launcher._coordination import exit_barrier
from resiliency.launcher._round_watch import RoundWatcher
from resiliency.launcher._shared_state import SharedRoundState

SETUPS = ("torchrun", "ft-polling", "ft-launcher")
_POLL_BARRIER_S = 0.05  # the old exit barrier's poll period


class Relay:
    """A TCP relay in front of the store that counts each connection's requests and bytes."""

    def __init__(self, target_port: int) -> None:
        self._target = target_port
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.setblocking(False)
        self.port = self._listener.getsockname()[1]
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._listener, selectors.EVENT_READ, None)
        self._lock = threading.Lock()
        self.requests = 0
        self.bytes = 0
        self._stop = False
        self._conns: list[socket.socket] = []
        self._thread = threading.Thread(target=self._run, name="store-relay", daemon=True)
        self._thread.start()

    def reset(self) -> None:
        with self._lock:
            self.requests = 0
            self.bytes = 0

    def counts(self) -> tuple[int, int]:
        with self._lock:
            return self.requests, self.bytes

    def _run(self) -> None:
        # pair state: [client socket, server socket, client spoke since the last answer]
        while not self._stop:
            for key, _ in self._sel.select(0.2):
                if key.data is None:
                    client, _ = self._listener.accept()
                    upstream = socket.create_connection(("127.0.0.1", self._target))
                    for s in (client, upstream):
                        s.setblocking(False)
                        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                        self._conns.append(s)
                    state = {"open": False}
                    self._sel.register(
                        client, selectors.EVENT_READ, (client, upstream, state, True)
                    )
                    self._sel.register(
                        upstream, selectors.EVENT_READ, (upstream, client, state, False)
                    )
                    continue
                src, dst, state, from_client = key.data
                try:
                    data = src.recv(1 << 16)
                except (BlockingIOError, InterruptedError):
                    continue
                except OSError:
                    data = b""
                if not data:
                    for s in (src, dst):
                        with contextlib.suppress(KeyError, ValueError):
                            self._sel.unregister(s)
                        s.close()
                    continue
                if from_client:
                    with self._lock:
                        self.bytes += len(data)
                        if not state["open"]:
                            self.requests += 1
                            state["open"] = True
                else:
                    state["open"] = False
                dst.setblocking(True)
                dst.sendall(data)
                dst.setblocking(False)

    def close(self) -> None:
        self._stop = True
        self._thread.join(5)
        for s in self._conns:
            s.close()
        self._listener.close()


@dataclass
class Node:
    rank: int
    store: dist.Store
    handler: DynamicRendezvousHandler
    round_store: dist.Store
    world: int


def _join(n: int, relay_port: int, run_id: str, rendezvous: bool) -> list[Node]:
    """N agents join one real c10d rendezvous; returns them in node-rank order.

    Without ``rendezvous``, each agent only builds torch's handler (whose
    ``num_nodes_waiting()`` still reads the rendezvous state from the store, at most once a
    second) and uses a namespace of the store as its round's store: torch's keep-alives are
    then missing from every setup.
    """
    nodes: list[Node] = []
    lock = threading.Lock()
    errors: list[BaseException] = []

    def agent() -> None:
        try:
            store = dist.TCPStore(
                "127.0.0.1", relay_port, is_master=False, timeout=timedelta(seconds=600)
            )
            backend = C10dRendezvousBackend(store, run_id)
            handler = DynamicRendezvousHandler.from_backend(
                run_id,
                store,
                backend,
                n,
                n,
                local_addr="127.0.0.1",
                timeout=RendezvousTimeout(
                    join=timedelta(seconds=900), last_call=timedelta(seconds=1)
                ),
            )
            if rendezvous:
                info = handler.next_rendezvous()
                node = Node(info.rank, store, handler, info.store, info.world_size)
            else:
                with lock:
                    rank = len(nodes)
                node = Node(rank, store, handler, dist.PrefixStore("round/", store), n)
            with lock:
                nodes.append(node)
        except BaseException as exc:  # reported below, with the others
            errors.append(exc)

    threads = [threading.Thread(target=agent, name=f"join-{i}") for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(960)
    if errors or len(nodes) != n:
        raise RuntimeError(f"rendezvous of {n} nodes failed: {errors[:3]}")
    return sorted(nodes, key=lambda node: node.rank)


def _steady(
    nodes: list[Node], setup: str, interval: float, window: float, tag: str, relay: Relay
) -> tuple[int, int, float]:
    """Every node supervises for ``window`` seconds the way ``setup`` does.

    Returns:
        Requests and bytes the relay counted in the window, and the window's length; the
        watchers' start (a connection and one read) and stop lie outside it.
    """
    stop = threading.Event()
    watchers: list[RoundWatcher] = []
    if setup == "ft-launcher":
        for node in nodes:
            shared = SharedRoundState(
                dist.PrefixStore(f"{tag}/", node.round_store), node.world, node.rank
            )
            watchers.append(RoundWatcher(shared).start())

    def supervise(i: int, node: Node) -> None:
        old_round = dist.PrefixStore(f"{tag}/", node.round_store)
        while not stop.wait(interval):
            node.handler.num_nodes_waiting()  # torch's own loop does this every interval
            if setup == "ft-polling":
                old_round.add("ft/events", 0)  # the old per-interval snapshot
            elif setup == "ft-launcher":
                watchers[i].snapshot()

    threads = [threading.Thread(target=supervise, args=(i, n)) for i, n in enumerate(nodes)]
    for t in threads:
        t.start()
    relay.reset()
    t0 = time.monotonic()
    time.sleep(window)
    stop.set()
    for t in threads:
        t.join(30)
    requests, sent = relay.counts()
    seconds = time.monotonic() - t0
    for watcher in watchers:
        watcher.stop()
    return requests, sent, seconds


def _barrier(nodes: list[Node], setup: str, spread: float, tag: str) -> float:
    """Nodes finish ``spread`` seconds apart (evenly) and go through the exit barrier."""
    n = len(nodes)
    start = time.monotonic()

    def finish(i: int, node: Node) -> None:
        time.sleep(spread * i / max(n - 1, 1))
        prefix = dist.PrefixStore(f"{tag}/", node.round_store)
        if setup == "torchrun":
            store_util.barrier(prefix, n, key_prefix="exit_barrier", barrier_timeout=300)
        elif setup == "ft-polling":
            prefix.add("ft/exit_arrived", 1)
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline:
                prefix.add("ft/events", 0)
                if int(prefix.add("ft/exit_arrived", 0)) >= n:
                    break
                time.sleep(_POLL_BARRIER_S)
        else:
            exit_barrier(SharedRoundState(prefix, n, node.rank), timeout=300)

    threads = [threading.Thread(target=finish, args=(i, x)) for i, x in enumerate(nodes)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(400)
    return time.monotonic() - start


def measure(
    n: int, intervals: list[float], window: float, spread: float, max_join: int
) -> list[dict]:
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    relay = Relay(server.port)
    rows: list[dict] = []
    started = time.monotonic()
    joined = n <= max_join

    def row(
        setup: str, phase: str, interval: float | None, requests: int, sent: int, seconds: float
    ) -> dict:
        return {
            "nodes": n,
            "rendezvous_joined": joined,
            "setup": setup,
            "phase": phase,
            "monitor_interval": interval,
            "seconds": round(seconds, 2),
            "requests_per_node_s": requests / n / seconds,
            "bytes_per_node_s": sent / n / seconds,
        }

    nodes = _join(n, relay.port, f"bench-{n}", joined)
    how = "rendezvous joined" if joined else "agents built, rendezvous NOT joined (no keep-alives)"
    print(f"N={n}: {how} in {time.monotonic() - started:.1f} s", flush=True)
    try:
        for setup in SETUPS:
            for interval in intervals:
                tag = f"{setup}-{interval}"
                requests, sent, seconds = _steady(nodes, setup, interval, window, tag, relay)
                rows.append(row(setup, "steady", interval, requests, sent, seconds))
                print(_line(rows[-1]), flush=True)
            relay.reset()
            seconds = _barrier(nodes, setup, spread, f"{setup}-barrier")
            requests, sent = relay.counts()
            rows.append(row(setup, "exit_barrier", None, requests, sent, seconds))
            rows[-1]["requests_per_node"] = requests / n
            print(_line(rows[-1]), flush=True)
    finally:
        relay.close()
    return rows


def _line(row: dict) -> str:
    interval = row["monitor_interval"]
    what = f"interval {interval:>4} s" if interval is not None else "exit barrier  "
    per_node = f" ({row['requests_per_node']:.1f} per node)" if "requests_per_node" in row else ""
    return (
        f"N={row['nodes']:>4} {row['setup']:<12} {row['phase']:<12} {what}: "
        f"{row['requests_per_node_s']:7.2f} requests/node/s, "
        f"{row['bytes_per_node_s']:8.0f} B/node/s over {row['seconds']:.1f} s{per_node}"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", default="8,64,256", help="comma-separated N")
    parser.add_argument("--intervals", default="0.1,1.0", help="monitor intervals (s)")
    parser.add_argument("--window", type=float, default=15.0, help="steady window (s)")
    parser.add_argument("--spread", type=float, default=3.0, help="exit barrier arrivals (s)")
    parser.add_argument(
        "--max-join",
        type=int,
        default=64,
        help="above this N the agents do not join the rendezvous (a 256-node c10d rendezvous "
        "in threads does not complete on a 2-core machine)",
    )
    parser.add_argument("--results", type=Path, help="write bench_store_load.json here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING)
    intervals = [float(x) for x in args.intervals.split(",")]
    rows: list[dict] = []
    for n in (int(x) for x in args.nodes.split(",")):
        rows.extend(measure(n, intervals, args.window, args.spread, args.max_join))
    if args.results:
        args.results.mkdir(parents=True, exist_ok=True)
        (args.results / "bench_store_load.json").write_text(json.dumps(rows, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    os._exit(code)  # the agents' keep-alive threads and store clients are not worth a clean join
