"""Reporting: the paper's way of summarising runs, and markdown tables.

Scripts build their reports from :class:`~cpcfl_tf.records.record.RunRecord`s with these helpers;
nothing here runs anything.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from cpcfl_tf.records.environment import machine


def provenance(records: Sequence) -> list[str]:
    """A note for a report whose runs come from more than one kind of CPU, or whose runs
    of one pre-training started from different encoders: their last bits differ, and on
    the quick preset that can move a result by about 1.5 points (docs/experiments.md,
    "Bit for bit"). Empty when every run shares both."""
    cpus: dict[str, int] = {}
    encoders: dict[str, set] = {}
    for record in records:
        cpu = machine(record.environment) or "CPU not recorded"
        cpus[cpu] = cpus.get(cpu, 0) + 1
        key = record.pretraining_key  # one pre-training should be one encoder
        if key is not None and record.environment.get("starting_encoder"):
            encoders.setdefault(key, set()).add(record.environment["starting_encoder"])
    lines = []
    if len(cpus) > 1:
        lines.append(
            f"Note: these {len(records)} runs come from {len(cpus)} kinds of CPU ("
            + "; ".join(f"{n} on {cpu}" for cpu, n in sorted(cpus.items()))
            + "): differences of about 1.5 points or less may be round-off."
        )
    split = sorted({key[0] for key, seen in encoders.items() if len(seen) > 1})
    if split:
        lines.append(
            "Note: runs with the same " + ", ".join(split) + " pre-training "
            "started from different encoders (`environment.starting_encoder`): "
            "it was redone, e.g. on another machine."
        )
    return lines


def markdown_table(header: Sequence[str], rows: Iterable[Sequence[Any]]) -> list[str]:
    """The lines of a markdown table: ``header``, the rule, one line per row (cells
    already formatted, or anything ``str`` shows as wanted)."""
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return lines


def mean_sd(values) -> tuple[float, float]:
    """Mean and standard deviation (ddof = 0, as the paper's trial tables compute it)."""
    values = np.asarray(values, np.float64)
    return float(values.mean()), float(values.std())


def mean_sd_cell(values, fmt: str = "{:.2f}") -> str:
    """A table cell of ``values`` (Nones left out): ``mean ± sd`` (:func:`mean_sd`), the
    value alone if there is one, ``-`` if none."""
    values = [v for v in values if v is not None]
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    mean, sd = mean_sd(values)
    return f"{fmt.format(mean)} ± {fmt.format(sd)}"


def trial_table(
    records: dict[str, list],
    labels: dict[str, str],
    value,
    *,
    percent: bool,
    paper: dict[str, tuple] | None = None,
) -> list[str]:
    """Markdown rows "label | trial 1 .. k | mean ± SD [| paper mean ± SD]" for the runs of
    each name in ``records`` (one record per trial), ``value(record) -> float``. With a
    single trial the mean ± SD column is left out (its SD would be a meaningless 0); the
    paper's column is headed "paper" alone when its figures are single runs (SD None)."""
    scale, fmt = (100.0, "{:.2f}") if percent else (1.0, "{:.4f}")
    trials = max(len(r) for r in records.values())
    summary = trials > 1
    paper_head = (
        ""
        if not paper
        else " paper mean ± SD |"
        if any(sd is not None for _, sd in paper.values())
        else " paper |"
    )
    lines = [
        "| method | "
        + " | ".join(f"trial {k + 1}" for k in range(trials))
        + (" | mean ± SD" if summary else "")
        + " |"
        + paper_head,
        "|" + "---|" * (1 + trials + summary + bool(paper)),
    ]
    for name, runs in records.items():
        values = [scale * value(r) for r in runs]
        row = (
            f"| {labels[name]} | "
            + " | ".join(fmt.format(v) for v in values)
            + " | " * (trials - len(values))
        )
        if summary:
            mean, sd = mean_sd(values)
            row += f" | {fmt.format(mean)} ± {fmt.format(sd)}"
        row += " |"
        if paper and name not in paper:  # a row beyond the paper
            row += " - |"
        elif paper:
            mean, sd = paper[name]
            spread = f" ± {fmt.format(sd)}" if sd is not None else ""
            row += f" {fmt.format(mean)}{spread} |"
        lines.append(row)
    return lines


def replace_block(path: Path, tag: str, key: str, lines: list[str]) -> bool:
    """Replace the generated block ``<!-- TAG:KEY -->`` ... ``<!-- /TAG -->`` of the
    markdown file ``path`` with ``lines`` (how scripts keep tables in a README current);
    False when the file has no such block."""
    from cpcfl_tf.records.files import write_text

    start, end = f"<!-- {tag}:{key} -->", f"<!-- /{tag} -->"
    text = path.read_text() if path.exists() else ""
    if start not in text:
        return False
    head, rest = text.split(start, 1)
    _, tail = rest.split(end, 1)
    write_text(path, head + start + "\n" + "\n".join(lines) + "\n" + end + tail)
    return True
