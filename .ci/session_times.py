"""Pass nox's output through unchanged and end it with every session's wall time, slowest first.

    nox 2>&1 | python3 .ci/session_times.py

A session's time runs from nox's "Running session NAME" line to its "Session NAME ..." verdict,
installs included.
"""

from __future__ import annotations

import re
import sys
import time

RUNNING = re.compile(r"^nox > Running session (?P<name>\S+)")
VERDICT = re.compile(r"^nox > Session (?P<name>\S+) (?P<verdict>was successful|failed|skipped)")


def main() -> None:
    started: dict[str, float] = {}
    rows: list[tuple[float, str, str]] = []
    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        now = time.monotonic()
        if match := RUNNING.match(line):
            started[match["name"]] = now
        elif (match := VERDICT.match(line)) and match["name"] in started:
            rows.append((now - started.pop(match["name"]), match["name"], match["verdict"]))
    # A session cut off (nox killed, a README command failing mid-session) has no verdict line.
    end = time.monotonic()
    rows += [(end - t0, name, "ended without a verdict") for name, t0 in started.items()]
    if rows:
        print("\nsession times, slowest first:")
        for took, name, verdict in sorted(rows, reverse=True):
            print(f"  {took:7.1f} s  {name:<24} {verdict}")
        print(f"  {sum(r[0] for r in rows):7.1f} s  in all")


if __name__ == "__main__":
    main()
