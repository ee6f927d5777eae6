"""tab:head_different_dataset and tab:head_different_dataset_stl10_mnist: CP-CFL (SimCLR)
with classifier heads c, c-1, c-2, c-3 on each pre-training -> client data pair.

Accuracy is reported at the quarters of the run (the paper: T = 25, 75, 100 of 100):
larger heads are expected to help most when rounds are few.
"""
from __future__ import annotations

from collections.abc import Sequence

from cpcfl_tf.errors import run_cli
from cpcfl_tf.evidence.dataset_pairs import dataset_pairs
from cpcfl_tf.plan.choices import HEADS
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__)

PAPER = {
    "STL-10 -> STL-10": {"c": (72.30, 76.30, 76.80), "c-1": (74.47, 77.77, 78.23),
                         "c-2": (75.43, 78.57, 77.60), "c-3": (76.37, 78.43, 77.90)},
    "STL-10 -> CIFAR-10": {"c": (67.20, 74.63, 75.00), "c-1": (70.23, 74.40, 75.70),
                           "c-2": (69.77, 74.57, 75.10), "c-3": (70.00, 74.83, 74.67)},
    "EMNIST -> MNIST": {"c": (96.20, 99.20, 99.27), "c-1": (96.87, 98.87, 98.93),
                        "c-2": (97.67, 99.03, 98.93), "c-3": (97.73, 98.90, 98.83)},
    "STL-10 -> MNIST": {"c": (93.70, 97.63, 98.40), "c-1": (94.20, 98.27, 98.13),
                        "c-2": (93.53, 98.53, 98.63), "c-3": (94.20, 98.13, 98.20)},
}
"""The paper's accuracy (%) at T = 25 / 75 / 100 per pair and head."""


def main(argv: Sequence[str] | None = None) -> None:
    session = SCRIPT.start(argv)
    config = session.config
    pairs = dataset_pairs(config)
    specs = {(pair.key, head): RunSpec(f"{pair.key}-cp-cfl-simclr-{head}", "cp-cfl", "simclr",
                                       federated={"head": head}, data=pair.data,
                                       partition=pair.partition)
             for pair in pairs for head in HEADS}
    session.kept(list(specs.values()))
    records = {key: session.runner.run(spec) for key, spec in specs.items()}

    from cpcfl_tf.evidence.plots import plot_accuracy_curves

    marks = config.federated.quarters
    lines = [f"# Classifier heads (preset `{config.preset}`), CP-CFL (SimCLR)", "",
             "Accuracy (%) at the quarters of the run; the paper's STL-10-family figures "
             "(GPU) at T = 25 / 75 / 100 in the last column.", ""]
    rows = []
    for pair in pairs:
        table = []
        for head in HEADS:
            record = records[(pair.key, head)]
            accuracy = [record.accuracy_at(t) for t in marks]
            table.append([head, *(f"{100 * a:.2f}" for a in accuracy),
                          " / ".join(f"{a:.2f}" for a in PAPER[pair.paper][head])])
            rows.append({"pair": pair.key, "paper_pair": pair.paper, "head": head,
                         **{f"accuracy_t{t}": a for t, a in zip(marks, accuracy)},
                         "ari": record.final.ari})
        lines += [f"## {pair.label} (stands for the paper's {pair.paper})", ""]
        lines += markdown_table(["head", *(f"T={t}" for t in marks), "paper T=25/75/100"],
                                table) + [""]
        plot_accuracy_curves({f"head {h}": records[(pair.key, h)] for h in HEADS},
                             session.out / f"accuracy-{pair.key}.png",
                             title=f"CP-CFL (SimCLR) by head, {pair.label}")
    session.finish("\n".join(lines), rows)


if __name__ == "__main__":
    run_cli(main)
