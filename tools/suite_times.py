"""The suite's test time per file, from pytest's ``--durations=0`` output, as a markdown
table (docs/performance.md, "The suite, file by file"): one column per log given, the
seconds of every test's setup, call and teardown summed per file, longest first. With
``--cpu``, the CPU seconds per file instead, in the test workers and in the processes
they ran, from the lines ``tests/conftest.py`` writes where ``$CPCFL_SUITE_CPU`` says;
with ``--workers``, from the same lines, each test worker's timeline: the files it ran
in order and when it finished, so an idle core at the suite's end shows.

    python -m pytest -q -n auto --dist loadfile --durations=0 > suite.log
    python tools/suite_times.py suite.log [another.log ...] [--names before,after]
    CPCFL_SUITE_CPU=cpu.jsonl python -m pytest -q -n auto --dist loadfile
    python tools/suite_times.py --cpu cpu.jsonl
    python tools/suite_times.py --workers cpu.jsonl
"""
from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

LINE = re.compile(r"\s*([0-9.]+)s (?:call|setup|teardown)\s+(tests/[^:]+)::")


def per_file(text: str) -> Counter:
    """Seconds per test file in one ``--durations=0`` listing."""
    seconds: Counter = Counter()
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            seconds[match.group(2)] += float(match.group(1))  # type: ignore[assignment]
    return seconds


def table(columns: dict[str, Counter], top: int = 12) -> list[str]:
    """Markdown rows: the ``top`` files of the last column (longest first), the rest
    summed, and the total."""
    last = list(columns.values())[-1]
    files = [f for f, _ in last.most_common(top)]
    rows = ["| file | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for f in files:
        rows.append(f"| `{Path(f).name}` | " + " | ".join(
            f"{c[f]:.0f} s" if f in c else "-" for c in columns.values()) + " |")
    rows.append("| the other files | " + " | ".join(
        f"{sum(v for k, v in c.items() if k not in files):.0f} s" for c in columns.values())
        + " |")
    rows.append("| all files | " + " | ".join(f"{sum(c.values()):.0f} s"
                                              for c in columns.values()) + " |")
    return rows


def cpu_table(text: str, top: int = 12) -> list[str]:
    """Markdown rows of CPU seconds per file (most first), from ``$CPCFL_SUITE_CPU``'s
    lines: in the test worker, in the processes it waited for, both; the rest summed,
    and the total."""
    worker: Counter = Counter()
    processes: Counter = Counter()
    for line in text.splitlines():
        entry = json.loads(line)
        name = entry["test"].split("::")[0]
        worker[name] += entry["worker"]
        processes[name] += entry["processes"]
    both = worker + processes
    files = [f for f, _ in both.most_common(top)]
    rest = [f for f in both if f not in files]

    def row(label, names):
        w, p = sum(worker[f] for f in names), sum(processes[f] for f in names)
        return f"| {label} | {w:,.0f} | {p:,.0f} | {w + p:,.0f} |"

    return (["| file | CPU-s in the worker | in its processes | both |", "|---|---|---|---|"]
            + [row(f"`{Path(f).name}`", [f]) for f in files]
            + [row("the other files", rest), row("all files", list(both))])


def worker_table(text: str) -> list[str]:
    """Markdown rows, one per test worker (process id) of ``$CPCFL_SUITE_CPU``'s lines:
    the files it ran, in order, each with the second its last test ended (counted from
    the end of the suite's first test); when the worker's last test ended; how long its
    core then waited for the last worker; its CPU seconds (worker and processes)."""
    entries = sorted((json.loads(line) for line in text.splitlines() if line.strip()),
                     key=lambda e: e.get("end", 0))
    timed = [e for e in entries if "pid" in e and "end" in e]
    if not timed:
        return []
    start, stop = timed[0]["end"], timed[-1]["end"]
    rows = ["| worker | files, in order (second each ended) | last test ended | then waited "
            "| CPU-s |", "|---|---|---|---|---|"]
    for k, pid in enumerate(dict.fromkeys(e["pid"] for e in timed)):
        mine = [e for e in timed if e["pid"] == pid]
        ended: dict[str, float] = {}
        for e in mine:
            ended[Path(e["test"].split("::")[0]).name] = e["end"] - start
        last = mine[-1]["end"] - start
        rows.append(f"| {k + 1} | " + ", ".join(f"`{f}` ({t:.0f} s)" for f, t in ended.items())
                    + f" | {last:.0f} s | {stop - start - last:.0f} s | "
                    f"{sum(e['worker'] + e['processes'] for e in mine):,.0f} |")
    return rows


def main(argv: Sequence[str] | None = None) -> None:
    from cpcfl_tf.errors import ArgumentParser

    parser = ArgumentParser(prog="python tools/suite_times.py",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path, help="pytest --durations=0 output "
                                                           "(with --cpu: one CPU log)")
    parser.add_argument("--names", help="comma-separated column names (default: the files)")
    parser.add_argument("--cpu", action="store_true",
                        help="the log is $CPCFL_SUITE_CPU's: CPU seconds per file")
    parser.add_argument("--workers", action="store_true",
                        help="the log is $CPCFL_SUITE_CPU's: each test worker's timeline")
    args = parser.parse_args(argv)
    if args.cpu or args.workers:
        flag = "--cpu" if args.cpu else "--workers"
        if args.cpu and args.workers:
            parser.error("--cpu and --workers read one CPU log each: give one of them")
        if len(args.logs) != 1:
            parser.error(f"{flag} takes one CPU log, got {len(args.logs)}")
        if not args.logs[0].is_file():
            parser.error(f"no such CPU log: {args.logs[0]}; write one with "
                         "CPCFL_SUITE_CPU=FILE python -m pytest ...")
        text = args.logs[0].read_text()
        rows = cpu_table(text) if args.cpu else worker_table(text)
        if not rows:
            parser.error(f"{args.logs[0]} has no worker timeline (lines without pid and "
                         "end, written before tests/conftest.py recorded them): write a new "
                         "one with CPCFL_SUITE_CPU=FILE python -m pytest ...")
        print("\n".join(rows))
        return
    names = args.names.split(",") if args.names else [str(p) for p in args.logs]
    if len(names) != len(args.logs):
        parser.error(f"--names gives {len(names)} names for {len(args.logs)} logs")
    missing = [str(p) for p in args.logs if not p.is_file()]
    if missing:
        parser.error(f"no such log: {', '.join(missing)}; write one with pytest --durations=0")
    print("\n".join(table({n: per_file(p.read_text()) for n, p in zip(names, args.logs)})))


if __name__ == "__main__":
    main()
