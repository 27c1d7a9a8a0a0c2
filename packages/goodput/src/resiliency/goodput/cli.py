"""The ``resiliency-goodput`` command: ``report``, ``advise`` and ``watch``."""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from collections.abc import Sequence
from datetime import tzinfo
from pathlib import Path
from types import FrameType
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from resiliency.goodput._render import render_advice, render_live, render_text
from resiliency.goodput._time import parse_duration
from resiliency.goodput.advice import advise
from resiliency.goodput.calculator import compute
from resiliency.goodput.errors import GoodputError
from resiliency.goodput.ledger import Ledger, LedgerReader, read_ledger

PROGRESS_MIN_BYTES = 20 << 20  # ledgers larger than this show progress on stderr


class _Progress:
    """Progress of reading on stderr: a bar on a terminal, a line per quarter otherwise."""

    def __init__(self) -> None:
        self.shown = -1
        self.tty = sys.stderr.isatty()

    def __call__(self, done: int, total: int) -> None:
        if total < PROGRESS_MIN_BYTES:
            return
        pct = int(100 * done / total)
        step = 2 if self.tty else 25
        if pct // step == self.shown // step and pct != 100:
            return
        self.shown = pct
        text = f"reading ledger: {pct:3d} % of {total / 1e6:.0f} MB"
        if self.tty:
            bar = "#" * (pct // 4)
            end = "\n" if pct >= 100 else ""
            print(f"\r{text} [{bar:<25}]", end=end, file=sys.stderr, flush=True)
        else:
            print(text, file=sys.stderr, flush=True)


def _reference(text: str) -> float | str:
    if text == "auto":
        return text
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"seconds or 'auto', not {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, not {text!r}")
    return value


def _duration(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _zone(text: str) -> tzinfo:
    try:
        return ZoneInfo(text)
    except (ZoneInfoNotFoundError, ValueError):
        raise argparse.ArgumentTypeError(
            f"unknown time zone {text!r} (an IANA name such as UTC or Europe/Paris)"
        ) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="resiliency-goodput",
        description="Goodput and badput breakdown of a training job's event ledger.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    report = sub.add_parser("report", help="compute the report of a ledger")
    report.add_argument("paths", nargs="+", help="ledger directories or files (JSON lines)")
    report.add_argument(
        "--reference-step-time",
        type=_reference,
        default="auto",
        metavar="S|auto",
        help="ideal seconds per step; auto = median of steps <= median + 3 MAD (default)",
    )
    report.add_argument("--json", action="store_true", help="print the report as JSON")
    report.add_argument("--plot", type=Path, metavar="OUT.png", help="also draw a PNG timeline")
    report.add_argument(
        "--window", type=_duration, metavar="1h", help="also break down per window of this length"
    )
    report.add_argument(
        "--timezone",
        type=_zone,
        default=ZoneInfo("UTC"),
        metavar="ZONE",
        help="zone of times written without one (Google's tracker: local time); default UTC",
    )
    advice = sub.add_parser("advise", help="how often to checkpoint, from the ledger")
    advice.add_argument("paths", nargs="+", help="ledger directories or files (JSON lines)")
    advice.add_argument("--json", action="store_true", help="print the advice as JSON")
    advice.add_argument("--reference-step-time", type=_reference, default="auto", metavar="S|auto")
    advice.add_argument("--timezone", type=_zone, default=ZoneInfo("UTC"), metavar="ZONE")
    watch = sub.add_parser("watch", help="print live figures of a running job's ledger")
    watch.add_argument("paths", nargs="+", help="ledger directory or files")
    watch.add_argument(
        "--interval", type=float, default=10.0, help="seconds between updates (default 10)"
    )
    watch.add_argument("--reference-step-time", type=_reference, default="auto", metavar="S|auto")
    watch.add_argument(
        "--timezone", type=_zone, default=ZoneInfo("UTC"), metavar="ZONE", help="as for report"
    )
    return parser


def _check_plot_path(path: Path) -> None:
    """Fail before any work when the PNG cannot be written where asked."""
    if path.is_dir():
        raise GoodputError(
            f"--plot {path} is a directory: give a file name such as {path}/goodput.png"
        )
    parent = path.parent
    if not parent.is_dir():
        raise GoodputError(
            f"cannot write the plot {path}: the directory {parent} does not exist "
            "(create it, or give --plot a path in an existing directory)"
        )


def _report(args: argparse.Namespace) -> int:
    if args.plot is not None:
        _check_plot_path(args.plot)
    ledger = _read(args)
    report = compute(ledger, args.reference_step_time, args.window)
    if args.json:
        print(json.dumps(report.to_json(), indent=2))
    else:
        sys.stdout.write(render_text(report))
    sys.stdout.flush()
    if args.plot is not None:
        if report.whole.total <= 0:
            raise GoodputError(
                f"nothing to plot: the ledger has no time span (fewer than two events); "
                f"{args.plot} not written"
            )
        from resiliency.goodput._plot import plot_report  # noqa: PLC0415 -- matplotlib is optional

        try:
            plot_report(report, ledger, args.plot)
        except OSError as exc:
            raise GoodputError(
                f"cannot write the plot {args.plot}: {exc.strerror or exc}"
            ) from None
        print(f"plot written to {args.plot}", file=sys.stderr)
    return 0


def _read(args: argparse.Namespace) -> Ledger:
    """The ledger named on the command line, its warnings and notes on stderr."""
    ledger = read_ledger(args.paths, progress=_Progress(), zone=args.timezone)
    if not ledger.files:
        raise GoodputError(
            f"no ledger in {', '.join(map(str, args.paths))}: no *.jsonl file there. Give the "
            "directory the job wrote its ledger to (ft-launcher --goodput-dir, "
            "RESILIENCY_GOODPUT_DIR) or its files"
        )
    for warning in ledger.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    for note in ledger.notes:
        print(f"note: {note}", file=sys.stderr)
    return ledger


def _advise(args: argparse.Namespace) -> int:
    advice = advise(_read(args), args.reference_step_time)
    if args.json:
        print(json.dumps(advice.to_json(), indent=2))
    else:
        sys.stdout.write(render_advice(advice))
    return 0


def _watch(args: argparse.Namespace) -> int:
    if args.interval <= 0:
        raise GoodputError(f"--interval must be positive, not {args.interval}")
    stop = False

    def _stop(signum: int, frame: FrameType | None) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, _stop)
    warned: set[str] = set()
    reader = LedgerReader(args.paths, args.timezone)  # each update parses what was appended
    while not stop:
        try:
            ledger = reader.update()
            for warning in ledger.warnings:
                if warning not in warned:
                    warned.add(warning)
                    print(f"warning: {warning}", file=sys.stderr, flush=True)
            print(render_live(compute(ledger, args.reference_step_time)), flush=True)
        except GoodputError as exc:
            print(f"waiting for the ledger: {exc}", file=sys.stderr, flush=True)
        deadline = time.monotonic() + args.interval
        while not stop and time.monotonic() < deadline:
            time.sleep(min(0.2, args.interval))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``resiliency-goodput``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        if args.command == "report":
            return _report(args)
        if args.command == "advise":
            return _advise(args)
        return _watch(args)
    except GoodputError as exc:
        print(f"resiliency-goodput: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
