"""Pass nox's output through unchanged and end it with every session's wall time, slowest first,
then every failed test pytest named, by session.

    nox 2>&1 | python3 .ci/session_times.py

A session's time runs from nox's "Running session NAME" line to its "Session NAME ..." verdict,
installs included. The failures are repeated at the end because a CI log is often read from its
tail only: a session's ``FAILED``/``ERROR`` summary lines are otherwise buried under the output
of every session that ran after it.
"""

from __future__ import annotations

import re
import sys
import time

RUNNING = re.compile(r"^nox > Running session (?P<name>\S+)")
VERDICT = re.compile(r"^nox > Session (?P<name>\S+) (?P<verdict>was successful|failed|skipped)")
# pytest's short test summary: "FAILED tests/x.py::test_y - AssertionError: ..." (and ERROR).
FAILED_TEST = re.compile(r"^(FAILED|ERROR) \S")
MAX_LINE = 400  # a summary line can hold a whole assertion message: its head names the failure


def main() -> None:
    started: dict[str, float] = {}
    rows: list[tuple[float, str, str]] = []
    failures: dict[str, list[str]] = {}
    current = "(before any session)"
    for line in sys.stdin:
        sys.stdout.write(line)
        sys.stdout.flush()
        now = time.monotonic()
        if match := RUNNING.match(line):
            started[match["name"]] = now
            current = match["name"]
        elif FAILED_TEST.match(line):
            failures.setdefault(current, []).append(line.rstrip("\n")[:MAX_LINE])
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
    if failures:
        print("\nfailed tests, by session:")
        for name, lines in failures.items():
            print(f"  {name}:")
            for failed in lines:
                print(f"    {failed}")


if __name__ == "__main__":
    main()
