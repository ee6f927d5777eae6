"""``results/README.md``'s table of the claims: one row per link, the paper's number,
ours, the verdict and the verdict with CP-CFL's merges fixed (:func:`verdict_table`)."""

from __future__ import annotations

from cpcfl_tf.evidence.claims_report import ours
from cpcfl_tf.evidence.judge import (
    CANNOT,
)
from cpcfl_tf.evidence.judging import Judged
from cpcfl_tf.running.report import markdown_table


def verdict_table(judged: list[Judged], fixed: list[Judged]) -> list[str]:
    """One row per link: claim, link, paper, ours (mean [interval], n), verdict, and the
    verdict with CP-CFL's merges fixed (``fixed``, one per claim of ``judged``)."""
    rows = []
    for j, f in zip(judged, fixed):
        for k, ((link, summary, _), (flink, fsummary, _)) in enumerate(zip(j.links, f.links)):
            verdict_ = CANNOT if j.claim.cannot else summary.verdict
            again = (
                "same runs"
                if flink == link
                else f"{CANNOT if f.claim.cannot else fsummary.verdict}: "
                f"{ours(fsummary, long=False)}"
            )
            rows.append(
                [
                    j.claim.id if k == 0 else "",
                    link.label,
                    link.paper,
                    ours(summary, long=False),
                    verdict_,
                    again,
                ]
            )
    return markdown_table(
        [
            "claim",
            "link",
            "paper (STL-10)",
            "ours: mean [95 % interval]",
            "verdict",
            "with the restart rule (beyond the paper)",
        ],
        rows,
    )
