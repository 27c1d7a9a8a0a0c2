"""A rank under torch's @record: rank 1 raises, rank 0 waits to be stopped (torch's contract)."""

from __future__ import annotations

import os
import time

from torch.distributed.elastic.multiprocessing.errors import record


@record
def main() -> None:
    if os.environ["RANK"] == "1":
        raise RuntimeError("injected failure in rank 1")
    time.sleep(120)


if __name__ == "__main__":
    main()
