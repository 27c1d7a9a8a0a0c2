"""Cost of the job-wide hang verdict as the job grows: store operations per node and time.

One real TCPStore (what a launcher's round uses), or with ``--etcd`` a real single-member etcd
started for the run (the ``etcd`` binary; the supervisor's etcd backend through the launcher's
``BackendStore``, one client per simulated node, its round trips counted by the backend), and N
simulated nodes of R ranks each, using
the launcher's own exchange (``JobHangExchange``): one node's ranks are stuck in a file read,
every other rank waits in an all-reduce. Every node announces or looks for the hang and
publishes its evidence (from 32 client threads, each with its own connection); then:

- the verdict's critical path, node by node as each runs on its own machine: node 0 reads every
  node's evidence, judges and publishes; another node reads and decodes that verdict;
- the store serving the verdict to every other node at once;
- the store operations each node made (counted on its connection);
- for comparison, what the design before this one cost: every node reading every node's
  evidence at once.

    python benchmarks/bench_job_verdict.py [--nodes 1000] [--ranks 8] [--etcd] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import torch.distributed as dist

from resiliency.launcher._backend_store import BackendStore
from resiliency.launcher._job_verdict import JobHangExchange
from resiliency.launcher._shared_state import SharedRoundState
from resiliency.launcher.verdict import Frame, judge_frames

_ALL_REDUCE = Frame(
    "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", 2800, "all_reduce"
)
_READ = Frame("/job/data/loader.py", 41, "read_shard")


class CountingStore:
    """A store connection that counts the operations made through it."""

    def __init__(self, store: Any, ops: Counter[str] | None = None) -> None:
        self._store = store
        self.ops: Counter[str] = Counter() if ops is None else ops

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._store, name)
        if not callable(attr):
            return attr

        def counted(*args: Any, **kwargs: Any) -> Any:
            self.ops[name] += 1
            return attr(*args, **kwargs)

        return counted


def _node_frames(node: int, ranks: int, victim: int) -> dict[int, Frame]:
    frame = _READ if node == victim else _ALL_REDUCE
    return {node * ranks + local: frame for local in range(ranks)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--threads", type=int, default=32)
    parser.add_argument("--sample", type=int, default=5, help="nodes whose verdict read is timed")
    parser.add_argument("--etcd", action="store_true", help="a real etcd instead of a TCPStore")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    if not args.etcd:
        return _run(args, None)
    # The tests' throw-away etcd (tests/etcd_server.py, standard library only).
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from etcd_server import EtcdServer  # noqa: PLC0415 - found on the path set just above

    with EtcdServer() as etcd:
        return _run(args, etcd.url("bench"))


def _run(args: argparse.Namespace, etcd_url: str | None) -> int:
    n, r, victim = args.nodes, args.ranks, args.nodes // 2
    server = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    local = threading.local()
    engine = "one TCPStore" if etcd_url is None else "one etcd (supervisor backend)"

    def connection() -> Any:
        if etcd_url is not None:
            from resiliency.supervisor import backend_from_url  # noqa: PLC0415 - an extra

            # One client per call: each simulated node's round trips are its backend's count.
            backend = backend_from_url(etcd_url, timeout=60)
            backend.ops.clear()  # the connection's own check, made once per job, not counted
            return BackendStore(backend, "round1/", 120)
        if not hasattr(local, "store"):
            local.store = dist.TCPStore(
                "127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=120)
            )
        return dist.PrefixStore("round1/", local.store)

    def round_trips(store: Any) -> Counter[str]:
        # The engine's own count where there is one (etcd), else the calls made.
        inner = getattr(store, "_store", store)
        return Counter(inner.backend.ops) if isinstance(inner, BackendStore) else store.ops

    counters: dict[int, CountingStore] = {}
    judged: dict[int, Counter[str]] = {}

    def publish(node: int) -> None:
        store = counters[node] = CountingStore(connection())
        exchange = JobHangExchange(SharedRoundState(store, world=n, rank=node), wait_s=60)
        frames = _node_frames(node, r, victim)
        if node == victim:
            exchange.announce()
        # Every node hands its ranks' frames as a local verdict: a node without a hang of its
        # own would first ask its monitors for its ranks' stacks, a local cost, no store op.
        verdict = judge_frames(frames)
        cycle = SimpleNamespace(ranks={local: rank for local, rank in enumerate(frames)})
        assert exchange.contribute(cycle, lambda: None, local=verdict, restart=0)  # type: ignore[arg-type]

    # The victim's node announces first, as its monitor finds the hang.
    publish(victim)
    start = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(publish, [i for i in range(n) if i != victim]))
    published_s = time.perf_counter() - start

    def judge(node: int) -> tuple[float, Any]:
        # This thread's own connection (a connection serves one call at a time), counted on
        # the node's counter.
        store = CountingStore(connection(), counters[node].ops)
        exchange = JobHangExchange(SharedRoundState(store, world=n, rank=node), wait_s=60)
        t0 = time.perf_counter()
        verdict = exchange.judge()
        elapsed = time.perf_counter() - t0
        if etcd_url is not None:
            judged[node] = round_trips(store)
        return elapsed, verdict

    # Each node runs on its own machine: time the critical path node by node, not all the
    # nodes' Python on this machine's cores at once.
    judge_s, verdict = judge(0)  # node 0: wait, read every node's evidence, judge, publish
    reads = [judge(node) for node in range(1, args.sample + 1)]  # a node: wait, read, decode
    read_s = statistics.median(t for t, _ in reads)
    assert {v.summary for _, v in reads} == {verdict.summary}  # one verdict everywhere
    culprit_nodes = sorted({verdict.nodes[rank] for rank in verdict.culprits})

    def read_verdict(node: int) -> None:
        connection().get("ft/hang/verdict")

    start = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as pool:  # the store's load: every node reads it
        list(pool.map(read_verdict, range(1, n)))
    all_verdicts_s = time.perf_counter() - start

    def read_all(_: int) -> None:
        keys = [f"ft/hang/evidence/{i}" for i in range(n)]
        store = connection()
        store.wait(keys, timedelta(seconds=60))
        store.multi_get(keys)

    start = time.perf_counter()
    with ThreadPoolExecutor(args.threads) as pool:
        list(pool.map(read_all, range(n)))
    all_read_s = time.perf_counter() - start

    if etcd_url is not None:  # the backend's round trips: publish's client plus judge's
        for node, c in counters.items():
            c.ops = round_trips(c) + judged.get(node, Counter())
    ops = {node: sum(c.ops.values()) for node, c in counters.items() if node <= args.sample}
    result = {
        "engine": engine,
        "nodes": n,
        "ranks_per_node": r,
        "culprit_nodes": culprit_nodes,
        "culprit_ranks": len(verdict.culprits),
        "publish_all_s": published_s,
        "judge_s": judge_s,
        "read_verdict_s": read_s,
        "verdict_after_last_evidence_s": judge_s + read_s,
        "store_serves_every_verdict_read_s": all_verdicts_s,
        "store_ops_max_per_node": max(ops.values()),
        "store_ops_judge": dict(counters[0].ops),
        "store_ops_other_node": dict(counters[1].ops),
        "before_every_node_reads_all_evidence_s": all_read_s,
    }
    print(
        f"{n} nodes x {r} ranks, {engine}: one verdict, naming node(s) {culprit_nodes} "
        f"({len(verdict.culprits)} ranks)\n"
        f"  node 0 reads every node's evidence, judges and publishes: {judge_s:.3f} s\n"
        f"  a node reads and decodes the verdict: {read_s:.3f} s (median of {args.sample})\n"
        f"  -> the verdict on a node {judge_s + read_s:.3f} s after the last evidence "
        "(target <= 2 s)\n"
        f"  the store serving the verdict to all {n - 1} other nodes at once: "
        f"{all_verdicts_s:.2f} s (their reads, from {args.threads} threads here)\n"
        f"  store operations per node: at most {max(ops.values())} (target <= 5); node 0 "
        f"{dict(counters[0].ops)}, the others {dict(counters[1].ops)}\n"
        f"  publishing every node's evidence ({args.threads} threads here): {published_s:.2f} s\n"
        f"  before (every node reading every node's evidence at once): {all_read_s:.2f} s"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))
    return 0 if culprit_nodes == [victim] else 1


if __name__ == "__main__":
    sys.exit(main())
