"""Run tiers_worker.py jobs: plain 2-process gloo jobs (one rank per "node"), or under ft-launcher.

Every node has its own local-tier directory; a node's GROUP_RANK can be permuted between jobs.
Every process is killed by pid (its session) after the job.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path
from typing import Any

from zygote_client import RANK_GROUPS, start_python

WORKER = Path(__file__).resolve().with_name("tiers_worker.py")
RANK_GROUP = Path(__file__).resolve().with_name("rank_group.py")
#: rank_group.py's per-rank variables (see its docstring).
RANK_ENVS_ENV = "RANK_GROUP_ENVS"
JOB_TIMEOUT_S = 240


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Cluster:
    """Two "nodes" with their own local dirs, one shared persistent dir and one output dir."""

    def __init__(self, tmp: Path, nodes: int = 2, persistent: str | None = None) -> None:
        self.tmp = tmp
        self.local = [tmp / f"node{n}-local" for n in range(nodes)]
        self.persistent: Path | str = persistent or tmp / "persistent"  # a directory or a URL
        self.out = tmp / "out"
        self.goodput = tmp / "goodput"
        for path in [*self.local, self.out, self.goodput]:
            path.mkdir(parents=True, exist_ok=True)
        self.jobs = 0

    def wipe(self, node: int) -> None:
        shutil.rmtree(self.local[node])
        self.local[node].mkdir()

    def env(self, node_dir: int, tag: str) -> dict[str, str]:
        return {
            **os.environ,
            "PYTHONUNBUFFERED": "1",
            "TIER_LOCAL_DIR": str(self.local[node_dir]),
            "TIER_OUT": str(self.out),
            "RESILIENCY_GOODPUT_DIR": str(self.goodput / tag),
            "RESILIENCY_JOB_ID": tag,
        }

    def run(
        self, steps: int, *extra: str, order: tuple[int, ...] = (0, 1), expect_ok: bool = True
    ) -> dict[int, dict[str, Any]]:
        """One plain job: the process on local dir ``order[g]`` is node (and rank) ``g``.

        The ranks are forked by rank_group.py from one process that imported torch once.
        """
        self.jobs += 1
        tag = f"job{self.jobs}"
        logs = self.tmp / tag
        logs.mkdir()
        per_rank = [
            {
                "TIER_LOCAL_DIR": str(self.local[node_dir]),
                "LOCAL_RANK": "0",
                "GROUP_RANK": str(group_rank),
            }
            for group_rank, node_dir in enumerate(order)
        ]
        argv = [str(RANK_GROUP), str(len(order)), str(logs), str(JOB_TIMEOUT_S)]
        argv += ["0", str(WORKER), str(self.persistent), str(steps), "--tag", tag, *extra]
        env = {**self.env(order[0], tag), RANK_ENVS_ENV: json.dumps(per_rank)}
        proc = start_python(RANK_GROUPS, argv, env, subprocess.PIPE)
        try:
            head, _ = proc.communicate(timeout=JOB_TIMEOUT_S + 30)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)  # the ranks and their writers, if left
            proc.wait(10)
        text = head.decode(errors="replace") + self.logs(tag)
        if expect_ok:
            assert proc.returncode == 0, f"{tag} exit code {proc.returncode}:\n{text[-8000:]}"
            return self.results(tag, len(order))
        assert "still running at" not in text, f"{tag} hung:\n{text[-8000:]}"
        return {}

    def logs(self, tag: str) -> str:
        return "".join(
            f"\n--- {p.name}\n" + p.read_text(errors="replace")
            for p in sorted((self.tmp / tag).glob("rank*.log"))
        )

    def results(self, tag: str, world: int) -> dict[int, dict[str, Any]]:
        out = {r: json.loads((self.out / f"{tag}-rank{r}.json").read_text()) for r in range(world)}
        for event in self.events(tag):
            if event["event"] == "checkpoint_loaded" and event.get("rank") in out:
                out[event["rank"]]["tier"] = event["tier"]
        return out

    def events(self, tag: str) -> list[dict[str, Any]]:
        events = []
        for path in sorted((self.goodput / tag).glob("*.jsonl")):
            events += [json.loads(line) for line in path.read_text().splitlines() if line]
        return events

    def committed(self, node_dir: int) -> dict[int, list[int]]:
        """step -> shards committed on a node's local tier."""
        out: dict[int, list[int]] = {}
        for step_dir in sorted(self.local[node_dir].glob("step_*")):
            shards = sorted(int(p.name.split("_")[1]) for p in step_dir.glob("shard_*"))
            out[int(step_dir.name.split("_")[1])] = shards
        return out

    def persistent_steps(self) -> list[int]:
        """Committed persistent steps (on an object store: those with a manifest)."""
        if isinstance(self.persistent, str):
            import fsspec  # noqa: PLC0415 -- only object-store tests need it

            fs, path = fsspec.core.url_to_fs(self.persistent, skip_instance_cache=True)
            found = fs.glob(f"{path}/step_*/manifest.json")
            return sorted(int(p.rsplit("/", 2)[-2].split("_")[1]) for p in found)
        return sorted(int(p.name.split("_")[1]) for p in self.persistent.glob("step_*"))


def kill_recorded(out: Path) -> None:
    """SIGKILL every worker recorded by a ``pid-<rank>-<pid>`` marker (and its session)."""
    for marker in out.glob("pid-*"):
        pid = int(marker.name.rsplit("-", 1)[1])
        for kill in (os.killpg, os.kill):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                kill(pid, signal.SIGKILL)
