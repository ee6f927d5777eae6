"""``claims.md``, the claims' report (:func:`report`): per link the paper's reading and
ours, the verdict and what would decide it, and its sections on the headroom to the
centralized baselines (:func:`headroom`) and when the true groups were found
(:func:`groups_found`)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cpcfl_tf.clustered.metrics import cluster_ari
from cpcfl_tf.clustered.restarts import cluster_sizes, clustering_failed
from cpcfl_tf.evidence.catalogue import COMPARISON_LABELS, client_settings
from cpcfl_tf.evidence.claims import Link
from cpcfl_tf.evidence.judge import (
    CANNOT,
    CLAIMS_RULE,
    Summary,
    bounds,
    final_accuracy,
    paired,
)
from cpcfl_tf.evidence.judging import Judged
from cpcfl_tf.evidence.tree import Evidence
from cpcfl_tf.methods.federated import run_label
from cpcfl_tf.plan.config import Config
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.running.report import markdown_table


def _number(value: float | None, digits: int = 2) -> str:
    return "-" if value is None else f"{value:+.{digits}f}"


def ours(summary: Summary, long: bool = True) -> str:
    """A link's mean and 95 % interval (``long``: with min and max) and n."""
    if not summary.n:
        return "-"
    interval = summary.interval
    if not long:
        return (
            f"{_number(summary.mean)} [{_number(interval[0])}, {_number(interval[1])}] "
            f"(n = {summary.n})"
            if interval
            else f"{_number(summary.mean)} (n = {summary.n})"
        )
    return (
        f"{_number(summary.mean)} [{_number(interval[0]) if interval else '-'}, "
        f"{_number(interval[1]) if interval else '-'}]; min {_number(min(summary.values))}, "
        f"max {_number(max(summary.values))} (n = {summary.n})"
    )


def _allows(summary: Summary) -> list[str]:
    """What a link's interval allows (:func:`~cpcfl_tf.evidence.judge.bounds`), whether the
    paper's difference is inside it, and the seeds that would decide the link."""
    inside, needed = summary.paper_inside, summary.seeds_needed
    return [
        bounds(summary),
        "-" if inside is None else "yes" if inside else "no",
        "-" if needed is None else str(needed),
    ]


FIXED_NOTE = (
    "*With the restart rule* (beyond the paper): the same link judged by the same "
    "rule with every CP-CFL run replaced by CP-CFL+restart's of the same seed, "
    "partition and settings (IFCA's restart rule added to CP-CFL: "
    "docs/choices.md). Where the rule never fires in a CP-CFL run, that run is "
    "CP-CFL+restart's bit for bit; only the runs where it fires are made. "
    "*same runs*: the link names no CP-CFL run."
)


def _why(j: Judged, link: Link, summary: Summary, missing: list[str], command: str) -> str:
    """A link's verdict as the report says it (with the command for missing runs)."""
    if j.claim.cannot:
        return f"{CANNOT}: {j.claim.cannot}"
    if summary.verdict != CANNOT:
        return summary.verdict
    what = "linear evaluation(s)" if link.linear_eval else "run(s)"
    why = (
        f"{CANNOT}: {len(missing)} {what} missing "
        f"(`{command} --claims {j.claim.id} --run --resume`)"
    )
    return why + (f"; so far (n = {summary.n}): {summary.so_far}" if summary.so_far else "")


def report(
    config: Config,
    results: Path,
    seeds: list[int],
    judged: list[Judged],
    headroom: list[list[str]],
    groups: list[str],
    command: str,
    fixed: list[Judged],
) -> str:
    """``claims.md``: per link the paper's reading (``judged``) and, beside it, the same
    link with CP-CFL's merges fixed (``fixed``, one per claim of ``judged``)."""
    lines = [
        f"# The paper's claims (preset `{config.preset}`)",
        "",
        f"Judged by `python experiments/claims.py --preset {config.preset}` from the run "
        f"records under `{results}`, seeds {', '.join(map(str, seeds))}. The paper's "
        "numbers are STL-10 on a GPU, copied from its tables; ours are points of "
        "accuracy (%) unless the link says otherwise.",
        "",
        CLAIMS_RULE,
        "",
        FIXED_NOTE,
    ]
    rows = []
    for j, f in zip(judged, fixed):
        for k, ((link, summary, missing), (flink, fsummary, fmissing)) in enumerate(
            zip(j.links, f.links)
        ):
            same = flink == link
            rows.append(
                [
                    f"{j.claim.id} {j.claim.text}" if k == 0 else "",
                    link.label,
                    link.paper,
                    " / ".join(_number(v) for v in summary.per_seed.values()) or "-",
                    ours(summary),
                    _why(j, link, summary, missing, command),
                    "same runs" if same else ours(fsummary, long=False),
                    "same runs" if same else _why(f, flink, fsummary, fmissing, command),
                ]
            )
    lines += markdown_table(
        [
            "claim",
            "link (ours: per seed, mean [95 % interval])",
            "paper",
            "ours per seed",
            "ours",
            "verdict",
            "with the restart rule: ours",
            "verdict",
        ],
        rows,
    )
    lines += [
        "",
        "## What the intervals allow",
        "",
        "Per link: the paper's difference, the largest effect the interval allows on "
        "the paper's side and on the other (a claim of no difference: its 90 % "
        "interval), whether the paper's difference lies inside the interval, and for "
        "a link not decided the seeds that would decide it at the mean and spread seen "
        "here (the rule above); then the same with the restart rule.",
        "",
    ]
    lines += markdown_table(
        [
            "claim",
            "link",
            "paper's difference",
            "ours allows",
            "paper's inside",
            "seeds to decide",
            "with the restart rule: ours allows",
            "paper's inside",
            "seeds to decide",
        ],
        [
            [
                j.claim.id if k == 0 else "",
                link.label,
                _number(link.effect),
                *_allows(summary),
                *(("same runs", "", "") if flink == link else _allows(fsummary)),
            ]
            for j, f in zip(judged, fixed)
            for k, ((link, summary, _), (flink, fsummary, _)) in enumerate(zip(j.links, f.links))
        ],
    )
    lines += ["", "## Verdict per claim", ""]
    lines += markdown_table(
        ["claim", "source in the paper", "verdict", "with the restart rule (beyond the paper)"],
        [
            [f"{j.claim.id} {j.claim.text}", j.claim.source, j.verdict, f.verdict]
            for j, f in zip(judged, fixed)
        ],
    )
    if headroom:
        lines += [
            "",
            "## Headroom: gap to the centralized by-group bound of the same seed",
            "",
            "Each method's accuracy minus the centralized by-group model's (points): how "
            "much the data left above each method.",
            "",
        ]
        lines += markdown_table(["method", "per seed", "mean (n)"], headroom)
    lines += groups
    return "\n".join(lines) + "\n"


HEADROOM_LABELS = {
    **COMPARISON_LABELS,
    **{f"cp-cfl-{pre}": run_label("cp-cfl", pre) for pre in ("byol", "simsiam")},
}
CLUSTERED = ("ifca-none", "ifca-fedavg", "cp-cfl-simclr", "cp-cfl-byol", "cp-cfl-simsiam")


def headroom(ev: Evidence) -> list[list[str]]:
    rows = []
    for name, label in HEADROOM_LABELS.items():
        runs = ev.together([name, "centralized-group"])
        gaps = paired(runs[name], runs["centralized-group"], final_accuracy)
        if gaps:
            values = list(gaps.values())
            rows.append(
                [
                    label,
                    " / ".join(f"{v:+.2f}" for v in values),
                    f"{sum(values) / len(values):+.2f} ({len(values)})",
                ]
            )
    return rows


def found_at(record: RunRecord) -> int | None:
    """The first round after which every client was in its true group (None: never)."""
    groups = np.array([c["group"] for c in record.clients])
    return next(
        (r.round for r in record.rounds if cluster_ari(groups, np.array(r.cluster_ids)) == 1.0),
        None,
    )


def _sizes(record: RunRecord) -> str:
    """The final clusters' sizes, e.g. ``16,40,4``."""
    return ",".join(
        map(
            str,
            cluster_sizes(
                np.array(record.rounds[-1].cluster_ids), record.config.federated.num_clusters
            ),
        )
    )


def _flagged(record: RunRecord) -> bool:
    """Whether IFCA's failure test flags the final clusters."""
    fl = record.config.federated
    return clustering_failed(
        np.array(record.rounds[-1].cluster_ids), fl.num_clusters, fl.min_cluster_share
    )


def groups_found(ev: Evidence) -> list[str]:
    """The "Groups found" section: per clustered method and seed, the final clusters'
    ARI and sizes, the round the true groups were first found and IFCA's restarts; and
    whether IFCA's failure test would have caught CP-CFL's runs that end without them."""
    rows, cp_cfl = [], []
    # C7's CP-CFL runs with other numbers of clients (the preset's own is CP-CFL (SimCLR)).
    sized = {
        f"c{n}": f"CP-CFL (SimCLR), {n} clients"
        for n, _ in client_settings(ev.config)
        if n != ev.config.partition.num_clients
    }
    for name in (*CLUSTERED, *sized):
        runs = list(ev.runs(name).values())
        if not runs:
            continue
        if name.startswith("cp-cfl") or name in sized:
            cp_cfl += runs
        found = [found_at(r) for r in runs]
        rows.append(
            [
                sized.get(name) or HEADROOM_LABELS[name],
                " / ".join(f"{r.final.ari:.2f}" for r in runs),
                " / ".join(_sizes(r) for r in runs),
                " / ".join("never" if f is None else str(f) for f in found),
                " / ".join(str(r.final.restarts) for r in runs),
                f"{sum(r.final.ari == 1.0 for r in runs)} of {len(runs)}",
            ]
        )
    if not rows:
        return []
    lines = [
        "",
        "## Groups found: the clusters against the true groups",
        "",
        "Per seed: the final clusters' adjusted Rand index against the clients' true "
        "groups (1: every client with its group) and their sizes, the first round after "
        "which every client was in its true group, and IFCA's restarts (the final "
        "attempt's rounds are the record's). A run that ends below 1 kept groups merged "
        "or split; the links that compare clustered methods move with it.",
        "",
    ]
    lines += markdown_table(
        [
            "method",
            "final ARI per seed",
            "final cluster sizes",
            "groups first found (round)",
            "restarts",
            "runs ending with the true groups",
        ],
        rows,
    )
    missed = [r for r in cp_cfl if r.final.ari is not None and r.final.ari < 1.0]
    if missed:
        kept = [r for r in cp_cfl if r.final.ari == 1.0]
        share = missed[0].config.federated.min_cluster_share
        lines += [
            "",
            f"CP-CFL has no restart rule (the paper gives it none). IFCA's failure "
            f"test (one model for every client, or a cluster below {share:g} of its "
            f"fair share: docs/choices.md), applied to CP-CFL's final clusters, "
            f"flags {sum(map(_flagged, missed))} of the {len(missed)} CP-CFL runs "
            f"that end below ARI 1 and {sum(map(_flagged, kept))} of the "
            f"{len(kept)} that end with the true groups.",
        ]
    return lines
