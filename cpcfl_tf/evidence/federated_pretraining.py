"""The federated pre-training study (``experiments/federated_pretraining.py``): its rows,
and from its runs' records and encoder scores the summary, the report and what they show
(CP-CFL from the server's SimCLR, from FedSimCLR on iid and non-IID deals, from
FedEMA-BYOL, beside IFCA (None), paired by seed by the claims' rule)."""

from __future__ import annotations

import json
import statistics

from cpcfl_tf.evidence.judge import compared, final_accuracy, verdict
from cpcfl_tf.methods.federated import START_LABELS, run_label
from cpcfl_tf.methods.starts import START
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.running.report import markdown_table

ROWS = (  # row, method, starting encoder, where the unlabeled images are
    ("ifca-none", "ifca", "none", "server"),
    ("cp-cfl-simclr", "cp-cfl", "simclr", "server"),
    ("cp-cfl-fed-simclr-iid", "cp-cfl", "fed-simclr", "iid"),
    ("cp-cfl-fed-simclr-groups", "cp-cfl", "fed-simclr", "groups"),
    ("cp-cfl-fedema-byol-groups", "cp-cfl", "fedema-byol", "groups"),
)
BASELINE, SERVER = "ifca-none", "cp-cfl-simclr"
NON_IID = ("cp-cfl-fed-simclr-groups", "cp-cfl-fed-simclr-iid")
"""The pair that says what non-IID unlabeled images cost: one method, one deal apart."""


def runs_environment(records) -> dict:
    """The machine that made the summarized runs: the fields of
    :func:`~cpcfl_tf.records.environment.environment` as their records give them (those of most of
    them, with ``"machines"``: how many there were, when they differ), so that the summary
    rebuilt elsewhere says the same."""
    from collections import Counter

    from cpcfl_tf.records.environment import environment

    fields = list(environment())
    seen = Counter(json.dumps({k: r.environment.get(k) for k in fields}) for r in records)
    if not seen:
        return environment()
    common = json.loads(seen.most_common(1)[0][0])
    return common if len(seen) == 1 else {**common, "machines": len(seen)}


def run_rows(specs, records, encoders) -> list[dict]:
    """One CSV row per run: its record's final accuracy, ARI and bytes, and its starting
    encoder's scores and pre-training cost (the means are the JSON's and the report's)."""
    encoder_of = {run: e for e in encoders.values() for run in e.get("runs", [])}
    rows = []
    for spec in specs:
        r, made = records[spec.name], encoder_of.get(spec.name, {})
        fed = made.get("federated", {})
        rows.append(
            {
                "run": spec.name,
                "row": spec.row,
                "seed": spec.seed,
                "pretraining": spec.pretraining,
                "deal": spec.partition.get("unlabeled", "server"),
                "accuracy": r.final.accuracy,
                "ari": r.final.ari,
                "bytes_down": r.final.bytes_down,
                "bytes_up": r.final.bytes_up,
                "linear_accuracy": made.get("linear_accuracy"),
                "knn_accuracy": made.get("knn_accuracy"),
                "pretrain_bytes": (fed["bytes_down"] + fed["bytes_up"]) if fed else None,
                "client_pretrain_seconds": fed.get("client_seconds"),
                "pretrain_seconds": made.get("pretrain_seconds"),
            }
        )
    return rows


def _mean(values) -> float | None:
    values = [v for v in values if v is not None]
    return statistics.fmean(values) if values else None


def summarize(specs, records, encoders) -> dict:
    by_row: dict[str, dict[int, RunRecord]] = {}
    for spec in specs:
        by_row.setdefault(spec.row, {})[spec.seed] = records[spec.name]
    encoder_of = {run: e for e in encoders.values() for run in e.get("runs", [])}
    rows = []
    for row, method, start, deal in ROWS:
        if row not in by_row:
            continue
        runs = by_row[row]
        made = [encoder_of.get(f"seed{s}-{row}") for s in runs]
        fed = [m.get("federated") if m else None for m in made]
        rows.append(
            {
                "row": row,
                "label": run_label(method, start),
                "deal": deal,
                "seeds": len(runs),
                "accuracy": _mean(final_accuracy(r) for r in runs.values()),
                "accuracy_sd": (
                    statistics.stdev(final_accuracy(r) for r in runs.values())
                    if len(runs) > 1
                    else None
                ),
                "ari": _mean(r.final.ari for r in runs.values()),
                "seeds_without_groups": sum(
                    r.final.ari is not None and r.final.ari < 1 for r in runs.values()
                ),
                "fl_megabytes": _mean(
                    (r.final.bytes_down + r.final.bytes_up) / 1e6 for r in runs.values()
                ),
                "pretrain_megabytes": _mean(
                    (f["bytes_down"] + f["bytes_up"]) / 1e6 if f else (0.0 if m else None)
                    for f, m in zip(fed, made)
                ),
                "client_pretrain_images": _mean(
                    f["images_trained"] if f else (0 if m else None) for f, m in zip(fed, made)
                ),
                "client_pretrain_seconds": _mean(
                    f["client_seconds"] if f else (0.0 if m else None) for f, m in zip(fed, made)
                ),
                "pretrain_seconds": _mean(m["pretrain_seconds"] if m else None for m in made),
                "linear_accuracy": _mean(m["linear_accuracy"] if m else None for m in made),
                "knn_accuracy": _mean(m["knn_accuracy"] if m else None for m in made),
            }
        )
    pairs = [
        (row, other)
        for row, _, start, _ in ROWS
        if START[start].federated
        for other in (BASELINE, SERVER)
    ] + [(SERVER, BASELINE), NON_IID]
    differences = {}
    for a, b in pairs:
        if a in by_row and b in by_row:
            diff = {
                s: final_accuracy(by_row[a][s]) - final_accuracy(by_row[b][s])
                for s in by_row[a]
                if s in by_row[b]
            }
            differences[f"{a} - {b}"] = verdict(diff).to_json()
    return {"rows": rows, "differences": differences}


def tables(text: str) -> list[str]:
    """The report from its first table on (what the results README carries)."""
    lines = text.rstrip("\n").split("\n")
    return lines[next(k for k, line in enumerate(lines) if line.startswith("|")) :]


def _f(value, digits: int = 2, sign: bool = False) -> str:
    if value is None:
        return "-"
    return f"{value:+.{digits}f}" if sign else f"{value:.{digits}f}"


def report(config, summary: dict) -> str:
    rows = summary["rows"]
    labels = {
        r["row"]: f"{r['label']} ({r['deal']})" if r["deal"] != "server" else r["label"]
        for r in rows
    }
    p, d = config.partition, config.data
    lines = [
        f"# Federated self-supervised pre-training (preset `{config.preset}`)",
        "",
        f"{p.num_clients} clients in {p.num_groups} groups; the unlabeled images "
        f"`{d.pretrain_dataset}:{d.pretrain_split}` on the server or dealt to the "
        "clients (`iid`, or `groups`: each client's from its own classes); server and "
        f"federated pre-training make the same passes over them ({config.pretrain.epochs}"
        "). Means over the seeds; linear and kNN accuracy of the starting encoder on "
        f"the proxy (`{d.client_dataset}:{d.client_train_split}` -> "
        f"`{d.client_test_split}`); bytes in MB per run (the pre-training's: every "
        "client's uploads and downloads; the server's sends nothing); the clients' "
        "pre-training compute in images trained and seconds (seconds as the records "
        "took them, other jobs sharing the cores or not).",
        "",
    ]
    lines += markdown_table(
        [
            "run",
            "unlabeled images",
            "seeds",
            "accuracy (%)",
            "sd",
            "ARI",
            "linear acc.",
            "kNN acc.",
            "pre-training MB",
            "FL MB",
            "client pre-training images",
            "client pre-training s",
            "pre-training s",
        ],
        [
            [
                r["label"],
                r["deal"],
                r["seeds"],
                _f(r["accuracy"]),
                _f(r["accuracy_sd"]),
                _f(r["ari"], 3),
                _f(r["linear_accuracy"], 4),
                _f(r["knn_accuracy"], 4),
                _f(r["pretrain_megabytes"], 1),
                _f(r["fl_megabytes"], 1),
                _f(r["client_pretrain_images"], 0),
                _f(r["client_pretrain_seconds"], 1),
                _f(r["pretrain_seconds"], 1),
            ]
            for r in rows
        ],
    )
    lines += [
        "",
        "Paired differences of final accuracy (points, per seed), judged by the "
        "claims' rule (the 95 % t interval of the differences):",
        "",
    ]
    out = []
    for name, diff in summary["differences"].items():
        a, b = name.split(" - ")
        ci = diff["ci95"]
        out.append(
            [
                f"{labels[a]} minus {labels[b]}",
                _f(diff["mean"], sign=True),
                "-" if ci is None else f"[{ci[0]:+.2f}, {ci[1]:+.2f}]",
                " / ".join(f"{v:+.2f}" for v in diff["per_seed"].values()),
                diff["verdict"],
            ]
        )
    lines += markdown_table(["difference", "mean", "95 % CI", "per seed", "verdict"], out)
    shows = findings(summary)
    if shows:
        lines += ["", "What it shows (written from the tables above):", ""]
        lines += [f"- {line}" for line in shows]
    return "\n".join(lines) + "\n"


SERVER_LABEL = "CP-CFL from the server's SimCLR"
IID_LABEL = "the iid deal's"


def findings(summary: dict) -> list[str]:
    """One sentence per federated encoder, from the verdicts and the encoders' means:
    where its CP-CFL run stands against IFCA (None) and against CP-CFL from the server's
    SimCLR (the claims' rule), how its encoder scores against the server's, and what its
    pre-training sends against the federated rounds' bytes."""
    rows = {r["row"]: r for r in summary["rows"]}
    server, differences = rows.get(SERVER), summary["differences"]
    lines = []
    if f"{SERVER} - {BASELINE}" in differences:
        lines.append(
            f"{SERVER_LABEL} is "
            f"{compared(differences[f'{SERVER} - {BASELINE}'], 'IFCA (None)')} by "
            "the claims' rule (the reference the federated encoders are held to)."
        )
    for row, _, start, deal in ROWS:
        if not START[start].federated or row not in rows:
            continue
        r = rows[row]
        line = (
            f"CP-CFL from {START_LABELS[start]} ({deal} deal) is "
            f"{compared(differences.get(f'{row} - {BASELINE}'), 'IFCA (None)')} and "
            f"{compared(differences.get(f'{row} - {SERVER}'), SERVER_LABEL)} by the "
            "claims' rule."
        )
        if server is not None and None not in (
            r["linear_accuracy"],
            r["knn_accuracy"],
            server["linear_accuracy"],
            server["knn_accuracy"],
        ):

            def side(key, r=r):
                return "below" if r[key] < server[key] else "at or above"

            line += (
                f" Its encoder scores {side('linear_accuracy')} the server's in linear "
                f"accuracy and {side('knn_accuracy')} it in kNN accuracy (means)."
            )
        if r.get("seeds_without_groups"):
            line += (
                f" In {r['seeds_without_groups']} of {r['seeds']} seeds its run ended "
                "without the true groups (ARI below 1)."
            )
        if r["pretrain_megabytes"] and r["fl_megabytes"]:
            line += (
                f" Its pre-training sends {r['pretrain_megabytes'] / r['fl_megabytes']:.0%}"
                " of the bytes the federated rounds send after it."
            )
        lines.append(line)
    groups, iid = NON_IID
    if f"{groups} - {iid}" in differences and groups in rows and iid in rows:
        g, i = rows[groups], rows[iid]
        lower = [
            name
            for name, key in (("linear", "linear_accuracy"), ("kNN", "knn_accuracy"))
            if None not in (g[key], i[key]) and g[key] < i[key]
        ]
        lines.append(
            "Non-IID unlabeled images (the groups deal against the iid deal, FedSimCLR): "
            "CP-CFL from the groups deal's encoder is "
            f"{compared(differences[f'{groups} - {iid}'], IID_LABEL)} by "
            "the claims' rule; its encoder scores "
            + (
                f"below the iid deal's in {' and '.join(lower)} accuracy (means)."
                if lower
                else "at or above the iid deal's in linear and kNN accuracy (means)."
            )
        )
    return lines
