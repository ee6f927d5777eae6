"""How the clustered-FL families' thresholds were chosen for the kit's models: CFL's eps1 and
eps2 from measured update norms, PACFL's number of singular vectors from the clustering
it gives, on partitions the reported seeds never use.

CFL splits a cluster when its members' mean update is small (the federation has
converged) while the largest update is still large (some members disagree), and the two
parts of its bipartition pull apart (their largest cross similarity is low). Those
numbers depend on the model, the optimizer and the learning rate, so the authors' values
do not carry over. This script runs CFL with splitting switched off (eps1 = 0) on
held-out seeds, from random weights and from the seed's own SimCLR encoder, once on the
preset's three groups and once on one group (where nothing should split), and reads the
norms every round records. PACFL needs p (``basis``): it is chosen by the ARI its
clustering gives on the held-out partitions.

The thresholds it derives (rule in the report) are what ``cpcfl_tf/methods/federated.py`` uses
for CFL and PACFL; ``docs/choices.md`` cites this report.
"""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.methods import clustering
from cpcfl_tf.methods.federated import METHODS, START_LABELS
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, default_preset="quick")

HELD_OUT = (10, 11, 12)
"""Partition seeds for calibration: the reported runs use seeds 0-4."""
BASES = (1, 2, 3, 4, 5, 6, 8, 10)
"""The values of PACFL's p tried."""
NO_SPLIT = {"eps1": 0.0, "eps2": 0.0, "max_cross": 1.0, "split_after": 20, "min_split_size": 3}
"""Every CFL option given (eps1 = 0: never split), so the runs do not depend on the
defaults they calibrate."""


def norm_specs(seeds: Sequence[int]) -> list[RunSpec]:
    """CFL without splits: three groups and one group, from random weights and SimCLR."""
    return [RunSpec(f"seed{seed}-{shape}-{pre}", "cfl", pre, seed=seed,
                    federated={"options": dict(NO_SPLIT)},
                    partition={} if shape == "groups" else {"num_groups": 1})
            for seed in seeds for shape in ("groups", "one-group") for pre in ("none", "simclr")]


def plateau(record, start: int) -> dict[str, float]:
    """Median over rounds > ``start`` of the one cluster's split test: mean-update norm,
    largest update norm, cross similarity of its bipartition."""
    tests = [r.split_test["0"] for r in record.rounds if r.round > start]
    return {k: float(np.median([t[k] for t in tests]))
            for k in ("mean_norm", "max_norm", "cross_similarity")}


def cfl_thresholds(measured: dict[str, dict[str, float]]) -> dict[str, float]:
    """The rule: after ``split_after`` rounds the norm tests should let a converged
    cluster split (eps1 = 1.25 x the largest mean-update norm, eps2 = 0.8 x the smallest
    largest-update norm, over every run), and the bipartition's cross similarity decides
    (max_cross = halfway between the largest three-group value and the smallest one-group
    value; an error when they do not separate). Two decimals."""
    groups = [m for name, m in measured.items() if "-groups-" in name]
    one = [m for name, m in measured.items() if "-one-group-" in name]
    apart = max(m["cross_similarity"] for m in groups)
    together = min(m["cross_similarity"] for m in one)
    if apart >= together:
        raise UserError(f"the three-group cross similarity ({apart:.3f}) is not below the "
                        f"one-group one ({together:.3f}): no max_cross separates them here")
    return {"eps1": round(1.25 * max(m["mean_norm"] for m in measured.values()), 2),
            "eps2": round(0.8 * min(m["max_norm"] for m in measured.values()), 2),
            "max_cross": round((apart + together) / 2, 2)}


def _options(parser) -> None:
    parser.add_argument("--seeds", type=int, default=1,
                        help=f"held-out seeds for CFL's norms (of {HELD_OUT}; default 1)")


def main(argv: Sequence[str] | None = None) -> None:
    session = SCRIPT.start(argv, _options)
    config, args = session.config, session.args
    if not 1 <= args.seeds <= len(HELD_OUT):
        raise UserError(f"--seeds must be in 1..{len(HELD_OUT)}, got {args.seeds}")
    from cpcfl_tf.clustered.metrics import cluster_ari

    # PACFL: the ARI of its clustering for each p on every held-out partition.
    aris = {}
    for seed in HELD_OUT:
        clients = session.runner.data.clients(config.with_overrides(seed=seed))
        # the leading p singular vectors are the first p of the leading max(BASES)
        widest = [clustering.data_subspace(x, max(BASES)) for x in clients.train.images]
        aris[seed] = [cluster_ari(clients.groups, clustering.subspace_clusters(
            [u[:, :p] for u in widest], config.federated.num_clusters)) for p in BASES]
    mean_ari = np.mean([aris[s] for s in HELD_OUT], axis=0)
    best = BASES[int(np.argmax(mean_ari))]  # the smallest p of the best mean ARI

    # CFL: the norms with splitting off.
    specs = session.kept(norm_specs(HELD_OUT[:args.seeds]))
    records = {spec.name: session.runner.run(spec) for spec in specs}
    split_after = int(NO_SPLIT["split_after"])
    measured = {name: plateau(r, split_after) for name, r in records.items()}

    lines = [f"# Calibrating the clustered-FL families (preset `{config.preset}`, "
             f"{config.partition.num_clients} clients, held-out seeds)", "",
             "## PACFL: ARI of the clustering by p (leading singular vectors per client)", ""]
    lines += markdown_table(["seed", *(f"p = {p}" for p in BASES)],
                            [[s, *(f"{a:.2f}" for a in aris[s])] for s in HELD_OUT]
                            + [["mean", *(f"{a:.2f}" for a in mean_ari)]])
    lines += ["", f"Chosen: the smallest p of the best mean ARI, **p = {best}** "
              f"(methods.py has p = {METHODS['pacfl'].options['basis']:g}).", "",
              "## CFL: update norms with splitting off", "",
              f"Median over rounds {split_after + 1}..{config.federated.rounds} (after "
              "`split_after`) of the one cluster's split test: its weighted mean-update norm, "
              "its largest update norm, and the largest cosine similarity across the two "
              "parts its bipartition would make.", ""]
    lines += markdown_table(
        ["run", "start", "mean-update norm", "largest update norm", "cross similarity"],
        [[name, START_LABELS[records[name].config.federated.pretraining], f"{m['mean_norm']:.3f}",
          f"{m['max_norm']:.3f}", f"{m['cross_similarity']:.3f}"]
         for name, m in measured.items()])
    derived, used = cfl_thresholds(measured), METHODS["cfl"].options
    lines += ["", "Derived: **" + ", ".join(f"{k} = {v:g}" for k, v in derived.items())
              + "** (methods.py has " + ", ".join(f"{k} = {used[k]:g}" for k in derived)
              + "). " + " ".join((cfl_thresholds.__doc__ or "").split())]
    rows = [{"run": name, "accuracy": records[name].final.accuracy, **m}
            for name, m in measured.items()]
    session.finish("\n".join(lines) + "\n", rows)


if __name__ == "__main__":
    run_cli(main)
