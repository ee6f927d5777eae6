"""tab:different_clusters: CP-CFL (SimCLR) with N = 1..5 cluster models.

The clients come in 3 true groups; N = 3 matches them. N = 1 is CP-CFL with a single
model (its Tc phase included), which the paper reports as FedAvg (SimCLR).
"""
from __future__ import annotations

from collections.abc import Sequence

from cpcfl_tf.errors import run_cli
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__)

SPECS = [RunSpec(f"cp-cfl-simclr-n{n}", "cp-cfl", "simclr", federated={"num_clusters": n})
         for n in range(1, 6)]
PAPER = {1: 59.33, 2: 65.10, 3: 76.80, 4: 72.80, 5: 72.97}
"""Accuracy (%) at T = 100 on STL-10 -> STL-10 (tab:different_clusters)."""


def main(argv: Sequence[str] | None = None) -> None:
    session = SCRIPT.start(argv)
    config = session.config
    records = {spec.federated["num_clusters"]: session.runner.run(spec)
               for spec in session.kept(SPECS)}

    from cpcfl_tf.evidence.plots import plot_accuracy_curves

    lines = [f"# Number of clusters (preset `{config.preset}`), CP-CFL (SimCLR), "
             f"{config.partition.num_clients} clients in {config.partition.num_groups} groups, "
             f"T = {config.federated.rounds}", ""]
    table, rows = [], []
    for n, record in records.items():
        final, best = record.final, record.best_accuracy()
        table.append([n, f"{100 * record.final_accuracy:.2f}", f"{100 * best:.2f}",
                      f"{final.ari:.3f}", f"{PAPER[n]:.2f}"])
        rows.append({"num_clusters": n, "accuracy": final.accuracy, "best": best,
                     "ari": final.ari, "f1_macro": final.scores["f1_macro"],
                     "bytes_down": final.bytes_down, "bytes_up": final.bytes_up})
    lines += markdown_table(["N", "accuracy (%)", "best (%)", "ARI", "paper (STL-10, T = 100)"],
                            table)
    plot_accuracy_curves({f"N = {n}": r for n, r in records.items()}, session.out / "accuracy.png",
                         title=f"CP-CFL (SimCLR) by number of clusters (preset {config.preset})")
    session.finish("\n".join(lines) + "\n", rows)


if __name__ == "__main__":
    run_cli(main)
