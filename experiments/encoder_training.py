"""tab:encoder_training: how much the encoder trains locally, for each classifier head.

CP-CFL (SimCLR) with the encoder trained in E_l,f = 3 (default), 1 or 0 (frozen) of the
3 local epochs (the head always trains 3), and the global-encoder variant (E_l,f = 3,
encoders of all clusters averaged into one), each with heads c, c-1, c-2, c-3.
"""
from __future__ import annotations

from collections.abc import Sequence

from cpcfl_tf.errors import run_cli
from cpcfl_tf.plan.choices import HEADS
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__)

def settings(local_epochs: int) -> dict[str, tuple[str, dict]]:
    """The four rows for E local epochs (the paper: E = 3)."""
    return {"e3": (f"E_l,f = {local_epochs} (default)", {"encoder_epochs": local_epochs}),
            "e1": ("E_l,f = 1", {"encoder_epochs": min(1, local_epochs)}),
            "e0": ("E_l,f = 0 (frozen)", {"encoder_epochs": 0}),
            "global": (f"E_l,f = {local_epochs} (global)",
                       {"encoder_epochs": local_epochs, "global_encoder": True})}


PAPER = {"e3": (76.80, 78.23, 77.60, 77.90), "e1": (76.90, 74.93, 74.80, 73.97),
         "e0": (73.67, 77.17, 77.57, 76.77), "global": (76.27, 79.10, 77.50, 78.03)}
"""Accuracy (%) at T = 100 on STL-10 -> STL-10, heads c, c-1, c-2, c-3."""


def specs(local_epochs: int) -> list[RunSpec]:
    return [RunSpec(f"cp-cfl-simclr-{head}-{key}", "cp-cfl", "simclr",
                    federated={"head": head, **overrides})
            for key, (_, overrides) in settings(local_epochs).items() for head in HEADS]


def main(argv: Sequence[str] | None = None) -> None:
    session = SCRIPT.start(argv)
    config = session.config
    local = config.federated.local_epochs
    records = session.run_all(specs(local))

    lines = [f"# Encoder in local training (preset `{config.preset}`), CP-CFL (SimCLR), "
             f"T = {config.federated.rounds}", "",
             "Accuracy (%) at the last round; the paper's STL-10 figure (T = 100) in brackets.", ""]
    table, rows = [], []
    for key, (label, _) in settings(local).items():
        cells = []
        for head, paper in zip(HEADS, PAPER[key]):
            record = records[f"cp-cfl-simclr-{head}-{key}"]
            final = record.final
            cells.append(f"{100 * record.final_accuracy:.2f} ({paper:.2f})")
            rows.append({"setting": key, "head": head, "accuracy": final.accuracy,
                         "ari": final.ari, "f1_macro": final.scores["f1_macro"]})
        table.append([label, *cells])
    lines += markdown_table(["setting", *HEADS], table)
    session.finish("\n".join(lines) + "\n", rows)


if __name__ == "__main__":
    run_cli(main)
