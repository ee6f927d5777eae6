"""The paper's encoder selection (``experiments/encoder_selection.py``): from the
candidates' scores, the choice per seed and method, each candidate's means over the
seeds, what the choice and CP-CFL from it show, and the report."""

from __future__ import annotations

from cpcfl_tf.evidence.judge import compared
from cpcfl_tf.methods.federated import run_label
from cpcfl_tf.methods.ssl import SSL_METHODS
from cpcfl_tf.plan.config import Config
from cpcfl_tf.running.report import markdown_table


def label(settings: dict) -> str:
    """Settings as one table cell (tables pass them through :func:`shown` first)."""
    return ", ".join(f"{k}={v}" for k, v in settings.items()) or "(its defaults)"


def choose(rows: list[dict]) -> dict[int, dict[str, dict]]:
    """Per seed and method the candidate with the best linear accuracy (the first in grid
    order on a tie): ``{seed: {method: {"settings", "linear_accuracy", "paper"}}}``."""
    chosen: dict[int, dict[str, dict]] = {}
    for row in rows:
        best = chosen.setdefault(row["seed"], {}).get(row["method"])
        if best is None or row["linear_accuracy"] > best["linear_accuracy"]:
            chosen[row["seed"]][row["method"]] = {
                "settings": row["settings"],
                "shown": row["shown"],
                "linear_accuracy": row["linear_accuracy"],
                "paper": row["paper"],
            }
    return chosen


def per_candidate(rows: list[dict], selected) -> list[dict]:
    """Per method and candidate (grid order): the seeds, mean linear and kNN accuracy over
    them, how often it was selected, and whether it is the method's default."""
    import statistics

    out: dict[tuple, dict] = {}
    for r in rows:
        key = (r["method"], label(r["shown"]))
        entry = out.setdefault(
            key,
            {
                "method": r["method"],
                "candidate": key[1],
                "default": r["paper"],
                "linear": [],
                "knn": [],
                "selected": 0,
            },
        )
        entry["linear"].append(r["linear_accuracy"])
        entry["knn"].append(r["knn_accuracy"])
        entry["selected"] += selected[r["seed"]][r["method"]]["settings"] == r["settings"]
    return [
        {
            **e,
            "seeds": len(e["linear"]),
            "linear": statistics.fmean(e["linear"]),
            "knn": statistics.fmean(e["knn"]),
        }
        for e in out.values()
    ]


def _moved(difference: dict) -> str:
    ci = difference["ci95"]
    interval = "" if ci is None else f", 95 % CI [{ci[0]:+.2f}, {ci[1]:+.2f}]"
    return (
        f"CP-CFL from the selected encoder is "
        f"{compared(difference, 'CP-CFL from the default one')} by the claims' rule "
        f"(mean {difference['mean']:+.2f} points{interval})"
    )


def findings(rows: list[dict], selected, runs: dict) -> list[str]:
    """One sentence per method, from the scores and the verdicts: how often the selection
    keeps the method's default (the paper's width for the paper's methods, with the
    source the registry gives), which candidate scores best on average, and how much
    selecting moves CP-CFL's accuracy."""
    lines = []
    cands = per_candidate(rows, selected)
    for method in dict.fromkeys(r["method"] for r in rows):
        mine = [c for c in cands if c["method"] == method]
        default = next((c for c in mine if c["default"]), None)
        n = len(selected)
        kept = sum(per[method]["paper"] for per in selected.values())
        spec = SSL_METHODS[method]
        line = f"{spec.label}: "
        if default is not None:
            sources = "; ".join(
                spec.settings[k].source
                for k in next(r["settings"] for r in rows if r["method"] == method and r["paper"])
            )
            line += (
                f"the selection keeps the default {default['candidate']} ({sources}) "
                f"in {kept} of {n} seeds"
            )
            others = [c for c in mine if not c["default"] and c["selected"]]
            if others:
                line += " and picks " + ", ".join(
                    f"{c['candidate']} in {c['selected']}" for c in others
                )
            line += "."
        best = max(mine, key=lambda c: c["linear"])
        line += (
            f" The best mean linear accuracy over the seeds is {best['candidate']}'s "
            f"({best['linear']:.4f}"
        )
        line += (
            "; "
            + ", ".join(f"{c['candidate']}: {c['linear']:.4f}" for c in mine if c is not best)
            + ")."
            if len(mine) > 1
            else ")."
        )
        if method in runs:
            if kept == n:
                line += (
                    " The selection kept the default in every seed, so CP-CFL starts "
                    "from the same encoder and does not move."
                )
            else:
                line += " " + _moved(runs[method]["difference"]) + "."
        lines.append(line)
    return lines


def summary_part(text: str) -> list[str]:
    """The report from its per-candidate means on (what the results README carries)."""
    lines = text.rstrip("\n").split("\n")
    return lines[lines.index(MEANS_TITLE) :]


MEANS_TITLE = "Per method and candidate, over the seeds:"


def report(config: Config, rows: list[dict], selected, runs: dict) -> str:
    data = config.data
    lines = [
        f"# Encoder selection (preset `{config.preset}`)",
        "",
        f"Each method's candidates pre-trained on `{data.pretrain_dataset}:"
        f"{data.pretrain_split}` ({config.pretrain.epochs} epochs), scored by linear "
        f"evaluation on the proxy (`{data.client_dataset}:{data.client_train_split}` -> "
        f"`{data.client_test_split}`); kNN accuracy: k = 200, weighted, same proxy. "
        'Bold: the candidate selected (best linear accuracy). "paper": the paper\'s '
        "value (SimCLR 256, BYOL and SimSiam 512; VICReg's own: 4 x the encoder's "
        "width).",
        "",
    ]
    lines += markdown_table(
        [
            "seed",
            "method",
            "candidate",
            "paper's",
            "linear accuracy",
            "kNN accuracy",
            "fingerprint",
        ],
        [
            [
                r["seed"],
                SSL_METHODS[r["method"]].label,
                label(r["shown"]),
                "yes" if r["paper"] else "",
                (
                    f"**{r['linear_accuracy']:.4f}**"
                    if selected[r["seed"]][r["method"]]["settings"] == r["settings"]
                    else f"{r['linear_accuracy']:.4f}"
                ),
                f"{r['knn_accuracy']:.4f}",
                r["fingerprint"],
            ]
            for r in rows
        ],
    )
    lines += ["", MEANS_TITLE, ""]
    lines += markdown_table(
        [
            "method",
            "candidate",
            "paper's",
            "seeds",
            "mean linear accuracy",
            "mean kNN accuracy",
            "selected in",
        ],
        [
            [
                SSL_METHODS[c["method"]].label,
                c["candidate"],
                "yes" if c["default"] else "",
                c["seeds"],
                f"{c['linear']:.4f}",
                f"{c['knn']:.4f}",
                c["selected"],
            ]
            for c in per_candidate(rows, selected)
        ],
    )
    lines += ["", "How often the selection picks the paper's value:", ""]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    lines += markdown_table(
        ["method", "seeds", "paper's value picked", "picked instead"],
        [
            [
                SSL_METHODS[m].label,
                len(selected),
                sum(per[m]["paper"] for per in selected.values()),
                ", ".join(
                    sorted(
                        {label(per[m]["shown"]) for per in selected.values() if not per[m]["paper"]}
                    )
                )
                or "-",
            ]
            for m in methods
        ],
    )
    if runs:
        lines += [
            "",
            "CP-CFL final accuracy (%) from the paper's encoder and from the "
            "selected one, paired by seed, judged by the claims' rule (the 95 % t "
            "interval of the per-seed differences: results/<preset>/claims.md):",
            "",
        ]
        lines += markdown_table(
            [
                "run",
                "from the paper's encoder",
                "from the selected encoder",
                "difference (points)",
                "95 % CI",
                "verdict",
            ],
            [
                [
                    run_label("cp-cfl", m),
                    " / ".join(f"{v:.2f}" for v in r["paper"].values()),
                    " / ".join(f"{v:.2f}" for v in r["selected"].values()),
                    f"{r['difference']['mean']:+.2f}",
                    (
                        "-"
                        if r["difference"]["ci95"] is None
                        else "[{:+.2f}, {:+.2f}]".format(*r["difference"]["ci95"])
                    ),
                    r["difference"]["verdict"],
                ]
                for m, r in runs.items()
            ],
        )
    lines += ["", "What it shows (written from the tables above):", ""]
    lines += [f"- {line}" for line in findings(rows, selected, runs)]
    return "\n".join(lines) + "\n"
