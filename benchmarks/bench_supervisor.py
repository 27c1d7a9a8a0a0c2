"""Supervisor: backend traffic per node, controller reaction time, and 1,000 simulated nodes.

    python benchmarks/bench_supervisor.py                 # TCPStore, and etcd when installed
    python benchmarks/bench_supervisor.py --nodes 1000 --duration 20 --json out.json
    python benchmarks/bench_supervisor.py --engines etcd,etcd-tls   # what TLS + RBAC cost

``etcd-tls`` is etcd with https only, client certificates required and authentication on (the
test suite's ``tests/supervisor/secure_etcd.py``: openssl and etcdctl), every client logged in
as a user whose role is read and write on ``resiliency/``.

Three measurements, each against a TCPStore and an etcd server started by the benchmark in their
own processes (so that their CPU time is the store's load alone):

1. steady-state traffic of one real ``NodeSensor``: round trips per interval, by operation
   (the target is at most one write per interval);
2. reaction time: a GPU fault appears in a node's probe; time until the controller's intent is
   in the backend, and until the sensor has handed it over (the launcher acts on its next look
   at the workers, ``--monitor-interval`` later);
3. ``--nodes`` simulated sensors (realistic documents: 8 ranks, scores, GPUs) publishing every
   ``--interval`` seconds through ``--connections`` client connections, with a real controller
   running every policy: the controller's loop time, the store's operations per second and CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from resiliency.supervisor import (
    Controller,
    GpuDevice,
    NodeSensor,
    NodeStatus,
    RankStatus,
    backend_from_url,
    keys_for,
    load_policies,
)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests" / "supervisor"))  # secure_etcd: the TLS etcd


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """A TCPStore or etcd server in its own process."""

    def __init__(self, kind: str, work: Path) -> None:
        self.kind = kind
        self.port = _free_port()
        self._secure = None
        if kind == "etcd-tls":
            from secure_etcd import SecureEtcd  # noqa: PLC0415 - only for this engine

            self._secure = SecureEtcd(work / "etcd-tls", str(shutil.which("etcd")), _free_port)
            self._secure.etcdctl("role", "add", "bench")
            self._secure.etcdctl(
                "role", "grant-permission", "bench", "readwrite", "resiliency/", "--prefix=true"
            )
            self._secure.etcdctl("user", "add", "bench", "--new-user-password", "bench-pw")
            self._secure.etcdctl("user", "grant-role", "bench", "bench")
            self.proc = self._secure.proc
            return
        if kind == "tcp":
            code = (
                "import datetime, time, torch.distributed as d\n"
                f"s = d.TCPStore('127.0.0.1', {self.port}, is_master=True, "
                "wait_for_workers=False, timeout=datetime.timedelta(seconds=60))\n"
                "time.sleep(3600)\n"
            )
            argv = [sys.executable, "-c", code]
        else:
            peer = _free_port()
            argv = [
                str(shutil.which("etcd")),
                "--data-dir",
                str(work / f"etcd-{self.port}"),
                "--listen-client-urls",
                f"http://127.0.0.1:{self.port}",
                "--advertise-client-urls",
                f"http://127.0.0.1:{self.port}",
                "--listen-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-advertise-peer-urls",
                f"http://127.0.0.1:{peer}",
                "--initial-cluster",
                f"default=http://127.0.0.1:{peer}",
                "--log-level",
                "error",
            ]
        self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 60
        while True:
            try:
                backend_from_url(self.url("probe"), timeout=2).close()
                break
            except Exception:
                if time.monotonic() > deadline or self.proc.poll() is not None:
                    self.stop()
                    raise RuntimeError(f"{kind} server did not start") from None
                time.sleep(0.2)

    def url(self, job: str) -> str:
        if self._secure is not None:
            return self._secure.url(job, user="bench:bench-pw")
        return f"{self.kind}://127.0.0.1:{self.port}/{job}"

    def cpu_s(self) -> float:
        return _cpu_s(self.proc.pid)

    def stop(self) -> None:
        if self._secure is not None:
            self._secure.stop()
            return
        self.proc.kill()
        self.proc.wait(10)


def _doc(node: str, seq: int, interval: float) -> NodeStatus:
    return NodeStatus(
        node=node,
        seq=seq,
        time=time.time(),
        interval=interval,
        state="running",
        host=node,
        pid=1234,
        group_rank=0,
        ranks={r: RankStatus(0.12, "step") for r in range(8)},
        step=1000 + seq,
        restarts=1,
        hangs={"heartbeat": 1},
        straggler_seq=seq // 10,
        straggler={r: {"section": 0.98, "gpu_relative": 0.97} for r in range(8)},
        gpu=[GpuDevice(i) for i in range(8)],
        checkpoint_age=30.0,
        failures=[{"attempt": 0, "cause": "hang:heartbeat"}],
    )


def steady_traffic(server: Server, interval: float, intervals: int) -> dict:
    """One real sensor: round trips per interval after the first document."""
    backend = backend_from_url(server.url("traffic"))
    sensor = NodeSensor(
        backend, "n0", lambda: {"state": "running"}, interval=interval, gpu=False, ledger_dir=""
    )
    sensor.start()
    time.sleep(interval * 1.5)
    before, seq0 = dict(backend.ops), sensor.latest.seq if sensor.latest else 0
    time.sleep(interval * intervals)
    after, seq1 = dict(backend.ops), sensor.latest.seq if sensor.latest else 0
    sensor.stop(final=False)
    backend.close()
    published = max(1, seq1 - seq0)
    per = {op: round((after.get(op, 0) - before.get(op, 0)) / published, 2) for op in after}
    writes = sum(v for op, v in per.items() if op in ("set", "put", "append", "compare_set"))
    return {"intervals": published, "ops_per_interval": per, "writes_per_interval": writes}


def reaction(server: Server, interval: float, repeats: int) -> dict:
    """Signal -> intent in the backend -> intent handed to the node's sensor."""
    to_intent, to_node = [], []
    for i in range(repeats):
        url = server.url(f"react{i}")
        node_backend = backend_from_url(url)
        ctl_backend = backend_from_url(url)
        fault = threading.Event()
        got: list[float] = []

        def probe(fault: threading.Event = fault) -> dict:
            gpu = [GpuDevice(0, ecc_uncorrectable=1 if fault.is_set() else 0)]
            return {"state": "running", "gpu": gpu}

        def handed(_intent: object, got: list[float] = got) -> None:
            got.append(time.monotonic())

        sensor = NodeSensor(
            node_backend, "n0", probe, interval=interval, gpu=False, ledger_dir="", on_intent=handed
        )
        policies, _ = load_policies({"policies": {"gpu_health": {}}})
        controller = Controller(ctl_backend, policies, interval=interval, recorder=object())
        sensor.start()
        runner = threading.Thread(target=controller.run, daemon=True)
        runner.start()
        time.sleep(interval * (1.5 + (i % 3) / 3))  # signals land at varied phases
        fault.set()
        t0 = time.monotonic()
        key = keys_for(ctl_backend.namespace).intent("n0")
        probe_backend = backend_from_url(url)
        while probe_backend.get(key) is None and time.monotonic() - t0 < 30:
            time.sleep(0.01)
        to_intent.append(time.monotonic() - t0)
        while not got and time.monotonic() - t0 < 30:
            time.sleep(0.01)
        to_node.append((got[0] if got else time.monotonic()) - t0)
        controller.stop()
        runner.join(10)
        sensor.stop(final=False)
        for b in (node_backend, ctl_backend, probe_backend):
            b.close()
    return {
        "interval_s": interval,
        "signal_to_intent_s": _stats(to_intent),
        "signal_to_node_s": _stats(to_node),
    }


def _stats(xs: list[float]) -> dict:
    return {
        "median": round(statistics.median(xs), 4),
        "min": round(min(xs), 4),
        "max": round(max(xs), 4),
        "n": len(xs),
    }


def _sensor_process(url: str, nodes: int, interval: float, conns: int, report: Path) -> None:
    """Simulated sensors (run in their own process, so they never share the controller's GIL).

    Writes ``{"writes": N, "put_s": [...]}`` to ``report`` when SIGTERM arrives.
    """
    stop = threading.Event()
    lat: list[float] = []
    written = [0]
    lock = threading.Lock()

    def sensors(names: list[str]) -> None:
        backend = backend_from_url(url, timeout=30)
        keys = keys_for(backend.namespace)
        payloads = {n: _doc(n, 0, interval).to_json() for n in names}
        seq = 0
        while not stop.is_set():
            start = time.monotonic()
            seq += 1
            for n in names:
                t = time.perf_counter()
                backend.put(keys.node(n), payloads[n], ttl=2 * interval)
                with lock:
                    lat.append(time.perf_counter() - t)
                    written[0] += 1
                if seq % 10 == 0:  # refresh the document's content now and then
                    payloads[n] = _doc(n, seq, interval).to_json()
            stop.wait(max(0.0, interval - (time.monotonic() - start)))
        backend.close()

    at_go = [0]

    def go(*_: object) -> None:  # SIGUSR1: the measurement starts now
        with lock:
            at_go[0] = written[0]
            lat.clear()

    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGUSR1, go)
    names = [f"node{i:04d}" for i in range(nodes)]
    threads = [threading.Thread(target=sensors, args=(names[i::conns],)) for i in range(conns)]
    for t in threads:
        t.start()
    while not stop.is_set():
        stop.wait(0.5)
        with lock:  # only the recent window matters; keep memory bounded
            del lat[:-20000]
    for t in threads:
        t.join(60)
    report.write_text(
        json.dumps({"writes": written[0], "put_s": lat, "writes_measured": written[0] - at_go[0]})
    )


def many_nodes(server: Server, nodes: int, interval: float, duration: float, conns: int) -> dict:
    """``nodes`` simulated sensors (another process) and one controller against one server."""
    url = server.url("many")
    report = Path(tempfile.mkdtemp(prefix="bench-sensors-")) / "report.json"
    proc = subprocess.Popen(
        [
            sys.executable,
            __file__,
            "--sensors",
            url,
            "--nodes",
            str(nodes),
            "--interval",
            str(interval),
            "--connections",
            str(conns),
            "--json",
            str(report),
        ],
    )
    ctl_backend = backend_from_url(url, timeout=30)
    prefix = keys_for(ctl_backend.namespace).nodes
    deadline = time.monotonic() + 180
    warm = time.monotonic()
    while len(ctl_backend.list(prefix)) < nodes:  # every simulated node has published once
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise RuntimeError("the simulated sensors did not all publish within 180 s")
        time.sleep(0.5)
    warm = time.monotonic() - warm
    policies, _ = load_policies(None)
    controller = Controller(ctl_backend, policies, interval=interval, recorder=object())
    proc.send_signal(signal.SIGUSR1)
    cpu0, t0 = server.cpu_s(), time.monotonic()
    loops, reads, seen = [], [], []
    ctl_ops = 0
    while time.monotonic() - t0 < duration:
        before = sum(ctl_backend.ops.values())
        stats = controller.cycle()
        ctl_ops += sum(ctl_backend.ops.values()) - before
        loops.append(stats.seconds)
        seen.append(stats.nodes)
        t = time.perf_counter()
        ctl_backend.list(prefix)  # the store read alone, for the breakdown
        reads.append(time.perf_counter() - t)
        time.sleep(max(0.0, interval - stats.seconds - reads[-1]))
    elapsed = time.monotonic() - t0
    cpu = server.cpu_s() - cpu0
    ctl_backend.close()
    proc.send_signal(signal.SIGTERM)
    proc.wait(120)
    sim = json.loads(report.read_text())
    shutil.rmtree(report.parent, ignore_errors=True)
    lat = sorted(sim["put_s"])
    writes_per_s = sim["writes_measured"] / elapsed
    return {
        "nodes": nodes,
        "interval_s": interval,
        "connections": conns,
        "duration_s": round(elapsed, 1),
        "first_publication_of_all_s": round(warm, 1),
        "controller_loop_s": _stats(loops),
        "controller_store_read_s": _stats(reads),
        "nodes_seen_median": statistics.median(seen),
        "sensor_writes_per_s": round(writes_per_s, 1),
        "writes_per_node_per_interval": round(writes_per_s * interval / nodes, 3),
        "controller_round_trips_per_cycle": round(ctl_ops / len(loops), 1),
        "store_cpu_percent": round(100 * cpu / elapsed, 1),
        "put_latency_ms": {
            "p50": round(1000 * lat[len(lat) // 2], 2),
            "p99": round(1000 * lat[int(len(lat) * 0.99)], 2),
        },
    }


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--engines", default="tcp,etcd")
    p.add_argument("--nodes", type=int, default=1000)
    p.add_argument("--interval", type=float, default=5.0, help="sensor interval of the 1,000")
    p.add_argument("--connections", type=int, default=16)
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--react-interval", type=float, default=1.0)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--sensors", default=None, help=argparse.SUPPRESS)  # internal: sensor process
    args = p.parse_args()
    if args.sensors is not None:
        _sensor_process(args.sensors, args.nodes, args.interval, args.connections, args.json)
        return 0
    work = Path(tempfile.mkdtemp(prefix="bench-supervisor-"))
    results: dict[str, dict] = {}
    try:
        for engine in args.engines.split(","):
            if engine.startswith("etcd") and shutil.which("etcd") is None:
                print(f"[bench_supervisor] {engine} skipped: the etcd binary is not installed")
                continue
            if engine == "etcd-tls" and not (shutil.which("etcdctl") and shutil.which("openssl")):
                print("[bench_supervisor] etcd-tls skipped: it needs etcdctl and openssl")
                continue
            server = Server(engine, work)
            try:
                r = results[engine] = {}
                r["steady"] = steady_traffic(server, 0.5, 10)
                print(f"[{engine}] steady state: {r['steady']}", flush=True)
                r["reaction"] = reaction(server, args.react_interval, args.repeats)
                print(f"[{engine}] reaction: {r['reaction']}", flush=True)
                r["many"] = many_nodes(
                    server, args.nodes, args.interval, args.duration, args.connections
                )
                print(f"[{engine}] {args.nodes} nodes: {r['many']}", flush=True)
            finally:
                server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(
        "\nengine  writes/interval  signal->intent  controller loop median/max  store writes/s  CPU"
    )
    for engine, r in results.items():
        m = r["many"]
        loop = m["controller_loop_s"]
        print(
            f"{engine:<7} {r['steady']['writes_per_interval']:<16} "
            f"{r['reaction']['signal_to_intent_s']['median']:<15} "
            f"{loop['median']:.3f}/{loop['max']:.3f} s{'':<14} "
            f"{m['sensor_writes_per_s']:<15} {m['store_cpu_percent']}%"
        )
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
