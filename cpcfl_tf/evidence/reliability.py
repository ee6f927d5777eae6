"""The clustering reliability study (``experiments/clustering_reliability.py``, beyond the
paper): its methods and pairs, and from its runs' records the report, the summary and the
sentences they say. How often CP-CFL (SimCLR), IFCA (None), CP-CFL+restart and
CP-CFL+features end with the clients' true groups, paired by run, the runs that merged
groups and why, and which remedy to use."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from cpcfl_tf.clustered.diagnostics import merges
from cpcfl_tf.evidence.judge import clopper_pearson, final_accuracy, paired, t_interval
from cpcfl_tf.methods.federated import run_label
from cpcfl_tf.records.record import RunRecord

ROWS = {
    "cp-cfl-simclr": ("cp-cfl", "simclr"),
    "ifca-none": ("ifca", "none"),
    "cp-cfl-restart-simclr": ("cp-cfl-restart", "simclr"),
    "cp-cfl-features-simclr": ("cp-cfl-features", "simclr"),
}
ROW_LABELS = {name: run_label(*row) for name, row in ROWS.items()}
REMEDIES = ("cp-cfl-restart-simclr", "cp-cfl-features-simclr")
"""The two remedies for CP-CFL's merges: the restart rule, and the first choice from the
features (no round added)."""
REMEDY_PRESETS = ("smoke", "quick")
"""The presets whose study holds CP-CFL+features by default (elsewhere name it with
``--methods``; results/README.md says where its runs stand)."""


def study_rows(preset: str) -> dict[str, tuple[str, str]]:
    """The rows of ``preset``'s study (:data:`REMEDY_PRESETS`)."""
    return {
        name: row
        for name, row in ROWS.items()
        if preset in REMEDY_PRESETS or name != "cp-cfl-features-simclr"
    }


PAIRS = (
    ("cp-cfl-simclr", "ifca-none"),
    ("cp-cfl-restart-simclr", "cp-cfl-simclr"),
    ("cp-cfl-restart-simclr", "ifca-none"),
    ("cp-cfl-features-simclr", "cp-cfl-simclr"),
    ("cp-cfl-features-simclr", "cp-cfl-restart-simclr"),
)
"""(a, b): the paired difference a − b of final accuracy, per run."""
C4 = ("ifca-none", "cp-cfl-simclr")
"""Claim C4's link: clustering failures of IFCA (None) minus CP-CFL (SimCLR)'s."""
GROUPS_LINK = "found: cp-cfl-features-simclr - cp-cfl-restart-simclr"
"""The remedies' paired difference in ending with the true groups (1 or 0 per run)."""


def encoder_seed(record: RunRecord) -> int | None:
    """The seed of the encoder a run started from (None: random weights)."""
    return None if record.from_random_weights else record.config.pretrain_seed


def found(record: RunRecord) -> bool:
    return record.final.ari == 1.0


def rounds_trained(record: RunRecord) -> int:
    """Rounds a run trained, its restarted attempts' too: each restart threw away the
    rounds up to its check (:func:`~cpcfl_tf.clustered.restarts.restart_check_round`)."""
    from cpcfl_tf.clustered.restarts import restart_check_round

    fl = record.config.federated
    return fl.rounds + record.final.restarts * restart_check_round(fl)


def first_choice(record: RunRecord):
    """The round record of the clients' first choice by loss, if it was diagnosed."""
    first = record.config.federated.head_rounds + 1
    return next((r for r in record.rounds if r.round == first and r.selection), None)


def comparable(
    a: dict[int, RunRecord], b: dict[int, RunRecord]
) -> tuple[dict[int, RunRecord], int]:
    """The runs of ``a`` that may be paired with ``b``'s of the same index: both from the
    same encoder bits (``environment.starting_encoder``), or either from random weights
    (an encoder pre-trained on another kind of machine has other bits: its runs are not
    the same experiment); and how many runs of ``a`` with a partner were left out."""

    def bits(record: RunRecord):
        return None if record.from_random_weights else record.environment.get("starting_encoder")

    kept = {
        i: r
        for i, r in a.items()
        if i not in b or None in (bits(r), bits(b[i])) or bits(r) == bits(b[i])
    }
    return kept, sum(i in b for i in a) - sum(i in b for i in kept)


def rescued(
    by_run: dict[str, dict[int, RunRecord]], remedy: str = "cp-cfl-restart-simclr"
) -> dict | None:
    """Paired by run: of CP-CFL (SimCLR)'s runs that did not end with the true groups, how
    many the ``remedy``'s run of the same partition and encoder ended with them."""
    plain, fixed = by_run.get("cp-cfl-simclr"), by_run.get(remedy)
    if not plain or not fixed:
        return None
    plain = comparable(plain, fixed)[0]
    missed = [i for i, r in plain.items() if not found(r) and i in fixed]
    return {"missed": len(missed), "found_by_restart": sum(found(fixed[i]) for i in missed)}


def worst_against_plain(by_run: dict[str, dict[int, RunRecord]], remedy: str) -> dict | None:
    """Paired by run against CP-CFL (SimCLR) (same partition and encoder): the ``remedy``'s
    worst run (its lowest accuracy difference, in points, and which run), and the runs in
    which it did not end with the true groups while CP-CFL (SimCLR) did (its merges that
    CP-CFL did not make), each with its difference. None without both."""
    plain, fixed = by_run.get("cp-cfl-simclr"), by_run.get(remedy)
    if not plain or not fixed:
        return None
    kept = comparable(fixed, plain)[0]
    diffs = paired(kept, plain, final_accuracy)
    if not diffs:
        return None
    run = min(diffs, key=lambda i: (diffs[i], i))
    return {
        "run": run,
        "difference": diffs[run],
        "merged_where_plain_found": [
            {"run": i, "difference": diffs[i]}
            for i in sorted(diffs)
            if not found(kept[i]) and found(plain[i])
        ],
    }


def first_choices(records: dict[int, RunRecord]) -> dict | None:
    """What the clients chose from at their first choice by loss (round Tc + 1), over the
    diagnosed runs of a method with a Tc phase: round Tc's accuracy, the clients' mean loss
    on the pool against a uniform guess's (ln of the classes the clients hold), and, per
    run, the share of clients that chose the model they had trained in round Tc (their last
    random pick), against chance (1/N) with the 95 % t interval over runs. None: no
    diagnosed run."""
    accuracy: list[float] = []
    loss: list[float] = []
    same: list[float] = []
    picks = total = classes = models = 0  # the last two: any run's (one config)
    for record in records.values():
        choice, tc = first_choice(record), record.config.federated.head_rounds
        if choice is None or tc < 1:
            continue
        clients = np.array(choice.selection["clients"])
        losses = np.array(choice.selection["losses"])
        last = np.array(record.rounds[tc - 1].cluster_ids)[clients]
        accuracy.append(record.accuracy_at(record.rounds[tc - 1].round))
        loss.append(float(losses.mean()))
        kept = np.argmin(losses, 1) == last
        same.append(float(kept.mean()))
        picks, total = picks + int(kept.sum()), total + len(kept)
        classes = len({k for c in record.clients for k in c["train_class_counts"]})
        models = losses.shape[1]
    if not same:
        return None
    interval = t_interval(same) if len(same) > 1 else (same[0], same[0])
    return {
        "runs": len(same),
        "accuracy_round_tc": float(np.mean(accuracy)),
        "pool_loss": float(np.mean(loss)),
        "uniform_loss": float(np.log(classes)),
        "chose_last_pick": picks,
        "clients": total,
        "last_pick_rate": float(np.mean(same)),
        "last_pick_ci95": [float(interval[0]), float(interval[1])],
        "chance": 1 / models,
    }


def margin_sets(records: dict[int, RunRecord]) -> dict[str, list[float]]:
    """The margins at the first choice by loss of the clients of diagnosed runs, in three
    sets: runs that found the groups, the merged groups of runs that merged some, and the
    other groups of those runs."""
    sets: dict[str, list[float]] = {
        "found": [],
        "merged groups": [],
        "other groups of merged runs": [],
    }
    for record in records.values():
        choice = first_choice(record)
        if choice is None:
            continue
        groups = np.array([c["group"] for c in record.clients])
        values = np.array(choice.selection["margins"])
        if found(record):
            sets["found"] += values.tolist()
            continue
        joined = merges(groups, [r.cluster_ids for r in record.rounds])
        inside = np.isin(
            groups[choice.selection["clients"]], [g for m in joined for g in m["groups"]]
        )
        sets["merged groups"] += values[inside].tolist()
        sets["other groups of merged runs"] += values[~inside].tolist()
    return sets


def figures(by_run: dict[str, dict[int, RunRecord]], out: Path, preset: str, every: bool) -> None:
    from cpcfl_tf.evidence.plots import plot_margin_distributions, plot_selection

    folder = out / "figures"
    folder.mkdir(exist_ok=True)
    for name, records in by_run.items():
        drawn_found = False
        for index, record in sorted(records.items()):
            if first_choice(record) is None or not (every or not found(record) or not drawn_found):
                continue
            drawn_found = drawn_found or found(record)
            plot_selection(
                record,
                folder / f"run{index}-{name}.png",
                title=f"{ROW_LABELS[name]}, run {index} (preset {preset}): "
                f"final ARI {record.final.ari:.2f}",
            )
    plot_margin_distributions(
        margin_sets(by_run.get("cp-cfl-simclr", {})),
        out / "margins.png",
        title=f"CP-CFL (SimCLR): clients' margins at their first choice by loss (preset {preset})",
    )


def method_summary(records: dict[int, RunRecord]) -> dict:
    rs = list(records.values())
    k, n = sum(map(found, rs)), len(rs)
    low, high = clopper_pearson(k, n) if n else (None, None)
    return {
        "found": k,
        "runs": n,
        "ci95": [low, high],
        "restarts": sum(r.final.restarts for r in rs),
        "runs_restarted": sum(r.final.restarts > 0 for r in rs),
        "megabytes": float(np.mean([(r.final.bytes_down + r.final.bytes_up) / 1e6 for r in rs]))
        if rs
        else None,
        "accuracy_found": [final_accuracy(r) for r in rs if found(r)],
        "accuracy_not_found": [final_accuracy(r) for r in rs if not found(r)],
        "merges_final_from": [
            m["final_from"]
            for r in rs
            if not found(r)
            for m in merges(
                np.array([c["group"] for c in r.clients]), [x.cluster_ids for x in r.rounds]
            )
        ],
    }
