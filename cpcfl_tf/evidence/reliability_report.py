"""The clustering reliability study's report (``experiments/clustering_reliability.py``):
its tables from the runs' records (:mod:`cpcfl_tf.evidence.reliability`), and the
sentences they say: what the study shows, the line of README's verdicts, and which
remedy for CP-CFL's merges to use."""

from __future__ import annotations

import numpy as np

from cpcfl_tf.clustered.diagnostics import merges
from cpcfl_tf.evidence.judge import (
    RULE,
    clopper_pearson,
    clustering_failures,
    compared,
    final_accuracy,
    paired,
    verdict,
)
from cpcfl_tf.evidence.reliability import (
    C4,
    GROUPS_LINK,
    PAIRS,
    REMEDIES,
    ROW_LABELS,
    comparable,
    encoder_seed,
    first_choice,
    first_choices,
    found,
    margin_sets,
    method_summary,
    rescued,
    rounds_trained,
    worst_against_plain,
)
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.running.report import markdown_table, mean_sd


def _rate(records: list[RunRecord]) -> str:
    k, n = sum(map(found, records)), len(records)
    low, high = clopper_pearson(k, n)
    return f"{k} of {n} ({100 * k / n:.0f} %; {100 * low:.0f}-{100 * high:.0f} %)"


def _mean(values, fmt="{:.2f}") -> str:
    values = list(values)
    if not values:
        return "-"
    mean, sd = mean_sd(values)
    return f"{fmt.format(mean)} ± {fmt.format(sd)} ({len(values)})"


def _median(values) -> str:
    values = list(values)
    return f"{np.median(values):.4f}" if values else "-"


def _link_row(text: str, result) -> list:
    if not result.n:
        return [text, 0, "-", "-", "-", result.verdict]
    interval = result.interval
    return [
        text,
        result.n,
        f"{result.mean:+.2f}",
        f"{result.values.min():+.2f} .. {result.values.max():+.2f}",
        f"[{interval[0]:+.2f}, {interval[1]:+.2f}]" if interval else "-",
        result.verdict,
    ]


def report(
    config, by_run: dict[str, dict[int, RunRecord]], runs: int, encoders: int, seed: int
) -> tuple[str, dict, list[dict]]:
    p, fl = config.partition, config.federated
    lines = [
        f"# Clustering reliability (preset `{config.preset}`): {p.num_clients} clients "
        f"in {p.num_groups} groups, N = {fl.num_clusters}, T = {fl.rounds}, Tc = "
        f"{fl.head_rounds}; runs {seed}..{seed + runs - 1}, {encoders} SimCLR encoders",
        "",
        "*true groups*: runs whose final clusters are the true groups (ARI 1), with the 95 % "
        "Clopper-Pearson interval of the rate. Accuracy (%) as mean ± SD (runs). "
        "*restarts*: IFCA's restart rule (CP-CFL+restart: the same rule, checked "
        f"{fl.restart_round} rounds after Tc), runs that used one / restarts in all. "
        "*settled*: the round after which no client changed cluster again."
        + (
            " CP-CFL+features: the first choice after Tc from k-means over the clients' "
            "mean embeddings by the frozen encoder, sent once before training."
            if "cp-cfl-features-simclr" in by_run
            else ""
        ),
        "",
    ]
    table = []
    for name, records in by_run.items():
        rs = list(records.values())
        if not rs:
            continue
        table.append(
            [
                ROW_LABELS[name],
                _rate(rs),
                _mean(final_accuracy(r) for r in rs if found(r)),
                _mean(final_accuracy(r) for r in rs if not found(r)),
                f"{sum(r.final.restarts > 0 for r in rs)} / {sum(r.final.restarts for r in rs)}",
                _mean((r.last_cluster_change() for r in rs), "{:.1f}"),
                _mean(((r.final.bytes_down + r.final.bytes_up) / 1e6 for r in rs), "{:.0f}"),
            ]
        )
    rate_table = markdown_table(
        [
            "method",
            "true groups",
            "accuracy, found",
            "accuracy, not found",
            "restarts (runs / all)",
            "settled after round",
            "MB sent",
        ],
        table,
    )
    lines += rate_table

    links, summary_links = [], {}

    def link(text: str, a: str, b: str, stat, key: str) -> None:
        """a − b of ``stat`` paired by run, over the runs of one starting encoder."""
        kept, left = comparable(by_run[a], by_run[b])
        result = verdict(paired(kept, by_run[b], stat))
        links.append(
            _link_row(
                text
                + (f" ({_count(left, 'run')} left out: another starting encoder)" if left else ""),
                result,
            )
        )
        summary_links[key] = {**result.to_json(), **({"left_out": left} if left else {})}

    for a, b in PAIRS:
        if a in by_run and b in by_run:
            link(
                f"accuracy: {ROW_LABELS[a]} − {ROW_LABELS[b]}",
                a,
                b,
                final_accuracy,
                f"{a} - {b}",
            )
    if all(name in by_run for name in C4):
        result = verdict(paired(by_run[C4[0]], by_run[C4[1]], clustering_failures))
        links.append(
            _link_row(
                f"C4, clustering failures (restarts, +1 if the final clusters "
                f"are not the groups): {ROW_LABELS[C4[0]]} − {ROW_LABELS[C4[1]]}",
                result,
            )
        )
        summary_links["C4"] = result.to_json()
    if all(name in by_run for name in REMEDIES):  # the remedies' groups, paired by run
        restart, features = REMEDIES
        link(
            f"true groups (1 where found, else 0): {ROW_LABELS[features]} − {ROW_LABELS[restart]}",
            features,
            restart,
            lambda r: float(found(r)),
            GROUPS_LINK,
        )
    lines += [
        "",
        "## Paired by run",
        "",
        "Per run (same partition and, for the SimCLR runs, the same encoder): the "
        "difference, its mean, min .. max and 95 % interval, and the claims' verdict "
        "(positive: the first method ahead; for C4, IFCA failing more often).",
        "",
    ]
    lines += markdown_table(["link", "n", "mean", "min .. max", "95 % interval", "verdict"], links)

    lines += [
        "",
        "## The runs that merged groups",
        "",
        "Each run whose final clusters are not the true groups: its encoder, final cluster "
        "sizes, the groups that share a model and the round from which they shared it for "
        "good, and, where the run recorded the diagnostic, the median margin at the "
        "clients' first choice by loss (second-lowest minus lowest pool loss) of the "
        "merged groups' clients and of the others.",
        "",
    ]
    margins = margin_sets(by_run.get("cp-cfl-simclr", {}))
    merged_rows = []
    for name, records in by_run.items():
        for r_index, record in sorted(records.items()):
            if found(record):
                continue
            groups = np.array([c["group"] for c in record.clients])
            choice = first_choice(record)
            joined = merges(groups, [r.cluster_ids for r in record.rounds])
            in_merge = {g for m in joined for g in m["groups"]}
            sizes = np.bincount(
                np.array(record.rounds[-1].cluster_ids),
                minlength=record.config.federated.num_clusters,
            )
            median_in = median_out = "-"
            if choice is not None:
                chose = np.array(choice.selection["clients"])
                values = np.array(choice.selection["margins"])
                inside = np.isin(groups[chose], list(in_merge))
                median_in, median_out = _median(values[inside]), _median(values[~inside])
            merged_rows.append(
                [
                    ROW_LABELS[name],
                    r_index,
                    "-" if encoder_seed(record) is None else encoder_seed(record),
                    ",".join(map(str, sizes)),
                    "; ".join(
                        f"groups {'+'.join(map(str, m['groups']))} from round {m['final_from']}"
                        for m in joined
                    )
                    or "split only",
                    record.final.restarts,
                    f"{final_accuracy(record):.2f}",
                    median_in,
                    median_out,
                ]
            )
    lines += (
        markdown_table(
            [
                "method",
                "run",
                "encoder",
                "final sizes",
                "merged",
                "restarts",
                "accuracy (%)",
                "margin, merged groups",
                "margin, others",
            ],
            merged_rows,
        )
        if merged_rows
        else ["None."]
    )
    lines += [
        "",
        "Median margin at the first choice by loss in CP-CFL (SimCLR)'s diagnosed "
        "runs, over the clients of each set: "
        + "; ".join(f"{label}: {_median(v)} ({len(v)} clients)" for label, v in margins.items())
        + ".",
    ]
    first = first_choices(by_run.get("cp-cfl-simclr", {}))
    if first:
        lines += [
            "",
            f"What CP-CFL (SimCLR)'s clients chose from at round Tc + 1 "
            f"({first['runs']} diagnosed runs): round Tc's accuracy "
            f"{100 * first['accuracy_round_tc']:.1f} % (mean over runs); the clients' "
            f"mean loss on the pool {first['pool_loss']:.3f}, against "
            f"{first['uniform_loss']:.3f} for a uniform guess over the classes; "
            f"{first['chose_last_pick']} of {first['clients']} clients chose the model "
            f"they trained in round Tc (per run {100 * first['last_pick_rate']:.0f} %, "
            f"95 % interval {100 * first['last_pick_ci95'][0]:.0f}-"
            f"{100 * first['last_pick_ci95'][1]:.0f} %; chance "
            f"{100 * first['chance']:.0f} %).",
        ]
    summary = {
        "preset": config.preset,
        "runs": runs,
        "encoders": encoders,
        "seed": seed,
        "first_choice_round": fl.head_rounds + 1,
        "first_choices": first,
        "methods": {name: method_summary(records) for name, records in by_run.items()},
        "links": summary_links,
        "margins": {
            k: {
                "clients": len(v),
                "median": float(np.median(v)) if v else None,
                "quartiles": np.percentile(v, [25, 75]).tolist() if v else None,
            }
            for k, v in margins.items()
        },
        "rescued": rescued(by_run),
    }
    if "cp-cfl-features-simclr" in by_run:  # the remedies side by side
        summary["rescued_by_features"] = rescued(by_run, "cp-cfl-features-simclr")
        summary["worst"] = {
            name: worst_against_plain(by_run, name) for name in REMEDIES if by_run.get(name)
        }
        summary["rounds"] = {
            name: float(np.mean([rounds_trained(r) for r in by_run[name].values()]))
            for name in REMEDIES
            if by_run.get(name)
        }
    shows = [f"- {line}" for line in findings(summary)]
    if shows:
        lines += ["", SHOWS_TITLE, "", *shows]
    lines += ["", "<details><summary>The rule</summary>", "", RULE, "</details>", ""]
    summary["table"] = [
        *rate_table,
        "",
        *markdown_table(["link", "n", "mean", "min .. max", "95 % interval", "verdict"], links),
        *(["", SHOWS_TITLE, "", *shows] if shows else []),
    ]
    rows = [
        {
            "run": name,
            "index": i,
            "seed": r.seeds["data"],
            "encoder_seed": encoder_seed(r),
            "accuracy": r.final.accuracy,
            "ari": r.final.ari,
            "found": found(r),
            "restarts": r.final.restarts,
            "settled": r.last_cluster_change(),
            "bytes_down": r.final.bytes_down,
            "bytes_up": r.final.bytes_up,
        }
        for name, records in by_run.items()
        for i, r in sorted(records.items())
    ]
    return "\n".join(lines), summary, rows


SHOWS_TITLE = "What it shows (written from the tables above):"


def verdict_line(config, summary: dict) -> str:
    """The study in one line beside the README's verdicts on the paper's claims: each
    method's rate of runs ending with the true groups and the verdicts of the restart
    variant against CP-CFL (SimCLR) and of CP-CFL (SimCLR) against IFCA (None)."""
    methods, links = summary["methods"], summary["links"]
    rates = "; ".join(
        f"{ROW_LABELS[name]} {m['found']} of {m['runs']} ({100 * m['ci95'][0]:.0f}-"
        f"{100 * m['ci95'][1]:.0f} %)"
        for name, m in methods.items()
    )
    pairs = "; ".join(
        f"{ROW_LABELS[a]} − {ROW_LABELS[b]}: {links[f'{a} - {b}']['verdict']}"
        for a, b in (PAIRS[1], PAIRS[0])
        if f"{a} - {b}" in links
    )
    return (
        f"Beyond the paper ({config.partition.num_clients} clients, T = "
        f"{config.federated.rounds}, `experiments/clustering_reliability.py`): runs ending "
        f"with the true groups, with the 95 % interval: {rates}. Accuracy, paired by run: "
        f"{pairs}."
    )


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def findings(summary: dict) -> list[str]:
    """The study in sentences, every figure from ``summary`` (the report's JSON): each
    method's rate, the cost of a merge, when CP-CFL's merges became final and what the
    margins at that choice show, what the restart rule changed, and the verdicts."""
    methods, links, lines = summary["methods"], summary["links"], []
    for name, m in methods.items():
        if not m["runs"]:
            continue
        low, high = m["ci95"]
        line = (
            f"{ROW_LABELS[name]} ends with the true groups in {m['found']} of {m['runs']} runs "
            f"({100 * m['found'] / m['runs']:.0f} %, 95 % interval {100 * low:.0f}-"
            f"{100 * high:.0f} %)"
        )
        if m["accuracy_not_found"] and m["accuracy_found"]:
            gap = np.mean(m["accuracy_found"]) - np.mean(m["accuracy_not_found"])
            line += f"; its runs without them end {gap:.2f} points below those with them (means)"
        lines.append(line + ".")
    plain = methods.get("cp-cfl-simclr")
    first = summary["first_choice_round"]
    if plain and plain["merges_final_from"]:
        at_first = sum(r <= first for r in plain["merges_final_from"])
        line = (
            f"Of CP-CFL (SimCLR)'s {_count(len(plain['merges_final_from']), 'merge')}, "
            f"{at_first} {'was' if at_first == 1 else 'were'} final from its first choice "
            f"by loss (round Tc + 1 = {first}) on"
        )
        merged = summary["margins"].get("merged groups", {}).get("median")
        found_ = summary["margins"].get("found", {})
        if merged is not None and found_.get("median") is not None:
            low, high = found_["quartiles"]
            line += (
                f"; at that choice the merged groups' clients had a median margin of "
                f"{merged:.4f}, against {found_['median']:.4f} (middle half "
                f"{low:.4f}-{high:.4f}) in the runs that found the groups: "
                + (
                    "smaller than three quarters of those, so near-equal losses over the "
                    "pool let two groups settle on one model"
                    if merged < low
                    else "not among the smallest, so a merge is not a near tie between models "
                    "but one model the best for two groups"
                )
            )
        lines.append(line + ".")
    chose = summary.get("first_choices")
    if plain and chose:
        lines.append(
            f"At that first choice CP-CFL's heads had trained for Tc rounds on random picks "
            f"and were still weak: round Tc's accuracy was {100 * chose['accuracy_round_tc']:.1f} "
            f"% and the clients' mean loss on the pool {chose['pool_loss']:.3f}, against "
            f"{chose['uniform_loss']:.3f} for a uniform guess over the classes; the clients chose "
            f"the model they had trained in round Tc in {100 * chose['last_pick_rate']:.0f} % of "
            f"cases (95 % interval over runs {100 * chose['last_pick_ci95'][0]:.0f}-"
            f"{100 * chose['last_pick_ci95'][1]:.0f} %, chance {100 * chose['chance']:.0f} %), "
            f"{_last_pick(chose)}."
        )
    saved, restart = summary.get("rescued"), methods.get("cp-cfl-restart-simclr")
    if restart and plain:
        line = (
            f"CP-CFL+restart restarted in {restart['runs_restarted']} of "
            f"{restart['runs']} runs ({_count(restart['restarts'], 'restart')})"
            + _rescued_phrase(saved)
        )
        if plain["megabytes"]:
            more = restart["megabytes"] / plain["megabytes"] - 1
            line += (
                f", sending {more:.1%} more bytes than CP-CFL (SimCLR) (means)"
                if more
                else ", sending the bytes CP-CFL (SimCLR) sends"
            )
        to_plain = compared(links.get("cp-cfl-restart-simclr - cp-cfl-simclr"), "CP-CFL (SimCLR)")
        to_ifca = compared(links.get("cp-cfl-restart-simclr - ifca-none"), "IFCA (None)")
        lines.append(f"{line}; in accuracy it is {to_plain} and {to_ifca} by the claims' rule.")
    features = methods.get("cp-cfl-features-simclr")
    if features and plain:
        saved = summary.get("rescued_by_features")
        line = (
            f"CP-CFL+features trained {summary['rounds']['cp-cfl-features-simclr']:.0f} "
            "rounds in every run (no restart, no round added)" + _rescued_phrase(saved)
        )
        if plain["megabytes"]:
            more = features["megabytes"] / plain["megabytes"] - 1
            line += (
                f", sending {more:.2%} more bytes than CP-CFL (SimCLR) (its clients' mean "
                "embeddings, once)"
            )
        to_plain = compared(links.get("cp-cfl-features-simclr - cp-cfl-simclr"), "CP-CFL (SimCLR)")
        to_restart = compared(
            links.get("cp-cfl-features-simclr - cp-cfl-restart-simclr"), "CP-CFL+restart (SimCLR)"
        )
        lines.append(f"{line}; in accuracy it is {to_plain} and {to_restart} by the claims' rule.")
        if worst_facts(summary):
            lines.append(worst_facts(summary))
    if "cp-cfl-simclr - ifca-none" in links:
        to_ifca = compared(links["cp-cfl-simclr - ifca-none"], "IFCA (None)")
        line = f"CP-CFL (SimCLR) is {to_ifca} in accuracy by the claims' rule over these runs"
        if "C4" in links:
            line += (
                "; C4's link (IFCA (None) fails to cluster more often than CP-CFL): "
                + links["C4"]["verdict"]
            )
        lines.append(line + ".")
    return lines


def remedy_lines(summary: dict) -> list[str]:
    """Which remedy for CP-CFL's merges a researcher should use, and why, every figure from
    ``summary``: the one ahead in accuracy by the claims' rule; else, with accuracy not
    told apart, the one that ends with the true groups more often by the same rule, paired
    by run (:data:`GROUPS_LINK`); else the cheaper in rounds and bytes, the other named as
    the safer where it ended with the true groups in more runs all the same. Empty
    without both remedies."""
    methods, links = summary["methods"], summary["links"]
    restart, features = (methods.get(name) for name in REMEDIES)
    if not restart or not features:
        return []
    versus = links.get("cp-cfl-features-simclr - cp-cfl-restart-simclr")
    groups = links.get(GROUPS_LINK)
    rounds = summary["rounds"]
    facts = (
        f"CP-CFL+features ends with the true groups in {features['found']} of "
        f"{features['runs']} runs and CP-CFL+restart in {restart['found']} of "
        f"{restart['runs']}; paired by run, CP-CFL+features is "
        f"{compared(groups, 'CP-CFL+restart')} in ending with them and "
        f"{compared(versus, 'it')} in accuracy by the claims' rule; CP-CFL+restart "
        f"trained {rounds['cp-cfl-restart-simclr']:.1f} rounds on average and sent "
        f"{restart['megabytes']:.0f} MB, CP-CFL+features "
        f"{rounds['cp-cfl-features-simclr']:.1f} rounds and {features['megabytes']:.0f} MB."
    )
    accuracy, groups_ = (None if x is None else x["verdict"] for x in (versus, groups))
    if accuracy in ("holds", "opposite"):
        choice = "CP-CFL+features" if accuracy == "holds" else "CP-CFL+restart"
        why = "it is ahead in accuracy by the claims' rule"
    elif groups_ in ("holds", "opposite"):
        choice = "CP-CFL+features" if groups_ == "holds" else "CP-CFL+restart"
        why = (
            "the two are not told apart in accuracy by the claims' rule, and it ends with "
            "the true groups more often by the same rule"
        )
    elif (
        rounds["cp-cfl-features-simclr"] <= rounds["cp-cfl-restart-simclr"]
        and features["megabytes"] <= restart["megabytes"]
    ):
        choice, why = (
            "CP-CFL+features",
            "the two are not told apart in accuracy or in how "
            "often they end with the true groups by the claims' rule, and it costs "
            "no more rounds or bytes",
        )
    else:
        choice, why = (
            "CP-CFL+restart",
            "the two are not told apart in accuracy or in how "
            "often they end with the true groups by the claims' rule, and it costs "
            "fewer rounds or bytes",
        )
    mine, theirs, other = (
        (features, restart, "CP-CFL+restart")
        if choice == "CP-CFL+features"
        else (restart, features, "CP-CFL+features")
    )
    caveat = (
        f" Where a run that ends with two groups on one model would be costly, {other} "
        f"is the safer of the two: it ended with the true groups in {theirs['found']} of "
        f"{theirs['runs']} runs here, {choice} in {mine['found']}, a difference the "
        f"claims' rule does not tell apart."
        if groups_ not in ("holds", "opposite") and theirs["found"] > mine["found"]
        else ""
    )
    return [
        f"Which remedy to use (beyond the paper, preset {summary['preset']}, "
        f"{summary['runs']} runs): {choice}, because {why}. {facts}{caveat}"
        + _worst_runs(summary, choice, other)
    ]


def _worst_runs(summary: dict, choice: str, other: str) -> str:
    """The remedies' worst runs against CP-CFL (SimCLR), paired by run, and the runs in
    which each merged groups CP-CFL found; and how they weigh beside the choice: a mean
    that does not tell two remedies apart says nothing of their worst run, which a user
    choosing a default pays in full."""
    facts = worst_facts(summary)
    if not facts:
        return ""
    worst = summary["worst"]
    by_label = {REMEDY_LABELS[name]: w for name, w in worst.items()}
    mine, theirs = by_label[choice], by_label[other]
    weigh = ""
    if mine["merged_where_plain_found"] and not theirs["merged_where_plain_found"]:
        weigh = (
            f" So {choice} costs nothing on average but once lost what CP-CFL (SimCLR) "
            f"had, which {other} never did: a user who weighs the worst run above the "
            f"mean, or runs only a few times, should take {other}."
        )
    elif theirs["merged_where_plain_found"] and not mine["merged_where_plain_found"]:
        weigh = f" {choice} is also the one that never lost groups CP-CFL (SimCLR) found."
    return f" {facts}{weigh}"


REMEDY_LABELS = {
    "cp-cfl-restart-simclr": "CP-CFL+restart",
    "cp-cfl-features-simclr": "CP-CFL+features",
}


def worst_facts(summary: dict) -> str:
    """Each remedy's worst run against CP-CFL (SimCLR), paired by run, and the runs in
    which it merged groups CP-CFL found (:func:`worst_against_plain`), in one sentence;
    empty without both remedies."""
    worst = summary.get("worst") or {}
    if any(worst.get(name) is None for name in REMEDIES):
        return ""
    said = []
    for name in REMEDIES:
        w = worst[name]
        merged = w["merged_where_plain_found"]
        said.append(
            f"{REMEDY_LABELS[name]}'s worst run against CP-CFL (SimCLR) is run "
            f"{w['run']} ({w['difference']:+.2f} points), and it merged groups "
            "CP-CFL (SimCLR) found in "
            + (
                ", ".join(f"run {m['run']} ({m['difference']:+.2f} points)" for m in merged)
                if merged
                else "no run"
            )
        )
    return "Worst runs, paired by run: " + "; ".join(said) + "."


def _rescued_phrase(saved: dict | None) -> str:
    """How many of CP-CFL's merged runs a remedy's runs ended with the true groups in
    (:func:`rescued`), as a findings line continues; empty where none merged."""
    if not saved or not saved["missed"]:
        return ""
    return (
        f" and ended with the true groups in {saved['found_by_restart']} of the "
        f"{saved['missed']} runs CP-CFL (SimCLR) merged"
    )


def _last_pick(first: dict) -> str:
    """Whether the clients chose their last random pick more often than chance."""
    low, high = first["last_pick_ci95"]
    return (
        "more often than chance: the last random pick pulls the first choice"
        if low > first["chance"]
        else "less often than chance"
        if high < first["chance"]
        else "no more often than chance: the last random pick does not decide the first choice"
    )
