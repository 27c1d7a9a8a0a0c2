"""Pass nox's output through unchanged and end it with every session's wall time, slowest first,
then every failed test pytest named, by session.

    nox 2>&1 | python3 .ci/session_times.py

A session's time runs from nox's "Running session NAME" line to its "Session NAME ..." verdict,
installs included. Sessions run by the ``suite`` session (tools/nox_lanes.py: two lanes at once,
each session's output printed when it ends) take their time from its "suite > NAME VERDICT in
N s" line instead; the session that ran them is listed apart, and its time is the suite's wall.

The failures are repeated at the end because a CI log is often read from its
tail only: a session's ``FAILED``/``ERROR`` summary lines are otherwise buried under the output
of every session that ran after it.
"""

from __future__ import annotations

import re
import sys
import time

RUNNING = re.compile(r"^nox > Running session (?P<name>\S+)")
VERDICT = re.compile(r"^nox > Session (?P<name>\S+) (?P<verdict>was successful|failed|skipped)")
# tools/nox_lanes.py's verdict on a session it ran:
# "suite > NAME passed in 12.3 s (lane 1, 20.5 s of CPU)".
LANE_VERDICT = re.compile(
    r"^suite > (?P<name>\S+) (?P<verdict>passed|failed.*|timed out.*) in (?P<took>[\d.]+) s "
    r"\(lane \d+(?:, (?P<cpu>[\d.]+) s of CPU)?"
)
# pytest's short test summary: "FAILED tests/x.py::test_y - AssertionError: ..." (and ERROR).
FAILED_TEST = re.compile(r"^(FAILED|ERROR) \S")
MAX_LINE = 400  # a summary line can hold a whole assertion message: its head names the failure


def main() -> None:
    started: dict[str, float] = {}
    rows: dict[str, tuple[float, str]] = {}
    cpu: dict[str, float] = {}  # the CPU time the suite measured for each session it ran
    runners: set[str] = set()  # sessions that ran others (the suite)
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
        elif match := LANE_VERDICT.match(line):
            rows[match["name"]] = (float(match["took"]), match["verdict"])
            if match["cpu"] is not None:
                cpu[match["name"]] = float(match["cpu"])
            runners.update(n for n in started if n != match["name"])
        elif (match := VERDICT.match(line)) and match["name"] in started:
            took = now - started.pop(match["name"])
            if match["name"] not in rows or match["name"] in runners:
                rows[match["name"]] = (took, match["verdict"])
    # A session cut off (nox killed, a README command failing mid-session) has no verdict line.
    end = time.monotonic()
    for name, t0 in started.items():
        rows.setdefault(name, (end - t0, "ended without a verdict"))
    if rows:
        print("\nsession times, slowest first (wall; CPU where the suite measured it):")
        timed = sorted(((t, n, v) for n, (t, v) in rows.items() if n not in runners), reverse=True)
        for took, name, verdict in timed:
            used = f"{cpu[name]:7.1f} s" if name in cpu else " " * 9
            print(f"  {took:7.1f} s  {used}  {name:<24} {verdict}")
        total_cpu = f"{sum(cpu.values()):7.1f} s" if cpu else " " * 9
        print(f"  {sum(r[0] for r in timed):7.1f} s  {total_cpu}  in all")
        for name in sorted(runners & rows.keys()):
            took, verdict = rows[name]
            print(
                f"  {took:7.1f} s  {' ' * 9}  {name:<24} {verdict} "
                "(wall time; it ran the sessions above)"
            )
    if failures:
        print("\nfailed tests, by session:")
        for name, lines in failures.items():
            print(f"  {name}:")
            for failed in lines:
                print(f"    {failed}")


if __name__ == "__main__":
    main()
