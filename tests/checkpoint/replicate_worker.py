"""Two real gloo ranks exchange one shard directory each through ``_replicate.exchange``.

    python rank_group.py 2 OUT DEADLINE_S 0 replicate_worker.py ROOT SCENARIO OUT

Each rank writes a source shard (a 3 MiB file and a 1-byte one) with its manifest under OUT,
sends it to the other rank, and receives the other's copy: rank 1 into ROOT (a small tmpfs in
the ``full`` scenario), rank 0 under OUT. Scenario ``short`` truncates rank 0's file after its
manifest was written. Each rank leaves ``rank<r>.json``: its copy's error, whether it verified,
whether its bytes equal the sender's.
"""

from __future__ import annotations

import json
import os
import sys
import zlib
from datetime import timedelta
from pathlib import Path

import torch.distributed as dist

from resiliency.checkpoint._tiers import replicate as _replicate

SIZE = 3 << 20


def _source(out: Path, rank: int) -> tuple[Path, dict]:
    src = out / f"src{rank}"
    src.mkdir()
    files = {"__0_0.distcp": bytes(range(256)) * (SIZE // 256) + bytes([rank]), ".metadata": b"m"}
    manifest: dict = {"nonce": "n", "files": {}}
    for name, data in files.items():
        (src / name).write_bytes(data)
        crc = f"{zlib.crc32(data) & 0xFFFFFFFF:08x}"
        manifest["files"][name] = {"size": len(data), "crc32": crc}
    return src, manifest


def rank_main(root: Path, scenario: str, out: Path) -> int:
    _replicate.CHUNK_BYTES = 256 << 10  # several chunks and rounds per file
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=timedelta(seconds=60))
    src, manifest = _source(out, rank)
    if scenario == "short" and rank == 0:
        os.truncate(src / "__0_0.distcp", SIZE // 2)
    incoming = _replicate.Incoming(1 - rank, (root if rank == 1 else out) / f"copy{rank}")
    _replicate.exchange(
        dist.group.WORLD,
        [_replicate.Outgoing(1 - rank, src, manifest)],
        [incoming],
        timeout_s=60,
        what=f"test exchange (rank {rank})",
    )
    sender = out / f"src{1 - rank}" / "__0_0.distcp"
    copy = incoming.directory / "__0_0.distcp"
    verified = not incoming.error and (incoming.directory / "manifest.json").exists()
    result = {
        "error": incoming.error,
        "verified": verified,
        "same": verified and copy.read_bytes() == sender.read_bytes(),
    }
    (out / f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(rank_main(Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])))
