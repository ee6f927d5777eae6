"""The suite's test time per file, from pytest's ``--durations=0`` output, as a markdown
table (docs/performance.md, "The suite, file by file"): one column per log given, the
seconds of every test's setup, call and teardown summed per file, longest first.

    python -m pytest -q -n auto --dist loadfile --durations=0 > suite.log
    python tools/suite_times.py suite.log [another.log ...] [--names before,after]
"""
from __future__ import annotations

import re
from collections import Counter
from pathlib import Path
from typing import Sequence

LINE = re.compile(r"\s*([0-9.]+)s (?:call|setup|teardown)\s+(tests/[^:]+)::")


def per_file(text: str) -> Counter:
    """Seconds per test file in one ``--durations=0`` listing."""
    seconds: Counter = Counter()
    for line in text.splitlines():
        match = LINE.match(line)
        if match:
            seconds[match.group(2)] += float(match.group(1))
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


def main(argv: Sequence[str] | None = None) -> None:
    from cpcfl_tf.errors import ArgumentParser

    parser = ArgumentParser(prog="python tools/suite_times.py",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("logs", nargs="+", type=Path, help="pytest --durations=0 output")
    parser.add_argument("--names", help="comma-separated column names (default: the files)")
    args = parser.parse_args(argv)
    names = args.names.split(",") if args.names else [str(p) for p in args.logs]
    if len(names) != len(args.logs):
        parser.error(f"--names gives {len(names)} names for {len(args.logs)} logs")
    missing = [str(p) for p in args.logs if not p.is_file()]
    if missing:
        parser.error(f"no such log: {', '.join(missing)}; write one with pytest --durations=0")
    print("\n".join(table({n: per_file(p.read_text()) for n, p in zip(names, args.logs)})))


if __name__ == "__main__":
    main()
