"""tab:encoder_pretraining: supervised vs contrastive pre-training of the encoder.

CP-CFL starts from an encoder pre-trained on the server's data either with SimCLR
(labels unused) or with labels (encoder + theta_c trained with cross-entropy, then the
head dropped), with the same epochs, batch size and learning rate. The paper
pre-trains on CIFAR-100 and runs the clients on CIFAR-10 (preset ``paper``); offline
presets use the preset's own data (pre-training split -> client split).
"""
from __future__ import annotations

from collections.abc import Sequence

from cpcfl_tf.errors import run_cli
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__)

PAPER = {"simclr": (70.13, 76.50, 77.17, 77.33), "supervised": (72.83, 76.80, 77.13, 77.13)}
"""The paper's accuracy (%) at T = 25/50/75/100, CIFAR-100 -> CIFAR-10."""
LABELS = {"simclr": "Contrastive (SimCLR)", "supervised": "Supervised"}
PAPER_DATA = {"pretrain_dataset": "cifar100", "pretrain_split": "train",
              "client_dataset": "cifar10", "client_train_split": "train",
              "client_test_split": "test"}
"""Sec. "Supervised versus contrastive pre-training": CIFAR-100 -> CIFAR-10."""


def main(argv: Sequence[str] | None = None) -> None:
    session = SCRIPT.start(argv)
    config = session.config
    data = PAPER_DATA if config.preset == "paper" else {}
    records = {spec.key: session.runner.run(spec) for spec in session.kept(
        [RunSpec(f"cp-cfl-{pre}", "cp-cfl", pre, data=data, row=pre) for pre in LABELS])}

    from cpcfl_tf.evidence.plots import plot_accuracy_curves

    source = records["simclr"].config.data
    marks = config.federated.quarters
    lines = [f"# Supervised vs contrastive pre-training (preset `{config.preset}`), "
             f"{source.pretrain_dataset}:{source.pretrain_split} -> "
             f"{source.client_dataset}", "",
             "Accuracy (%) of CP-CFL; the paper's CIFAR-100 -> CIFAR-10 figures (GPU, "
             "T = 25/50/75/100) in the last column.", ""]
    table, rows = [], []
    for pre, record in records.items():
        accuracy = [record.accuracy_at(t) for t in marks]
        table.append([LABELS[pre], *(f"{100 * a:.2f}" for a in accuracy),
                      " / ".join(f"{a:.2f}" for a in PAPER[pre])])
        rows.append({"pretraining": pre, **{f"accuracy_t{t}": a for t, a in zip(marks, accuracy)},
                     "f1_macro": record.final.scores["f1_macro"], "ari": record.final.ari})
    lines += markdown_table(["pre-training", *(f"T={t}" for t in marks), "paper"], table)
    plot_accuracy_curves({LABELS[k]: r for k, r in records.items()}, session.out / "accuracy.png",
                         title=f"CP-CFL by encoder pre-training (preset {config.preset})")
    session.finish("\n".join(lines) + "\n", rows)


if __name__ == "__main__":
    run_cli(main)
