"""Other kinds of heterogeneity than the paper's class groups (beyond the paper):
FedAvg (None), IFCA (None) and CP-CFL (SimCLR) on rotated groups and on label skew.

* ``rotated-4``: 4 groups, every client holds every class, group g's images turned by g
  quarter turns (IFCA's own benchmark); N = 4.
* ``dirichlet-0.1`` and ``dirichlet-1.0``: 3 groups, each with its class distribution
  drawn from Dir(alpha); N = 3. Small alpha: groups with few, distinct classes.

The server's SimCLR encoder is the preset's, pre-trained on unturned, unlabeled images.
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from cpcfl_tf.errors import run_cli
from cpcfl_tf.plan.config import Config
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

METHODS = {"fedavg-none": ("fedavg", "none", "FedAvg (None)"),
           "ifca-none": ("ifca", "none", "IFCA (None)"),
           "cp-cfl-simclr": ("cp-cfl", "simclr", "CP-CFL (SimCLR)")}
SETTINGS: dict[str, tuple[str, dict[str, Any]]] = {
    "rotated-4": ("rotated, 4 groups", {"kind": "rotated", "num_groups": 4}),
    "dirichlet-0.1": ("Dir(0.1), 3 groups", {"kind": "dirichlet", "alpha": 0.1}),
    "dirichlet-1.0": ("Dir(1.0), 3 groups", {"kind": "dirichlet", "alpha": 1.0})}
"""Setting key: (label, partition overrides)."""
SCRIPT = Script(__file__, __doc__, rows=tuple(METHODS))


def specs(config: Config) -> list[RunSpec]:
    """Every setting x method; client counts rounded up to a multiple of the groups."""
    out = []
    for key, (_, partition) in SETTINGS.items():
        groups = partition.get("num_groups", config.partition.num_groups)
        clients = -(-config.partition.num_clients // groups) * groups
        if config.preset == "smoke":  # smoke's 600 digits cannot hold a disjoint skewed draw
            partition = {**partition, "disjoint": False}
        for name, (method, pre, _) in METHODS.items():
            out.append(RunSpec(f"{key}-{name}", method, pre, row=name,
                               partition={**partition, "num_clients": clients},
                               federated={"num_clusters": groups}))
    return out


def main(argv: Sequence[str] | None = None) -> None:
    session = SCRIPT.start(argv)
    config = session.config
    records = session.run_all(specs(config))

    from cpcfl_tf.evidence.plots import plot_accuracy_curves

    lines = [f"# Other kinds of heterogeneity (preset `{config.preset}`), "
             f"T = {config.federated.rounds}", "",
             "Accuracy (%) at the last round / best round, and the ARI of the final cluster "
             "ids against the true groups. No paper numbers: the paper has only class "
             "groups.", ""]
    table, rows = [], []
    for name, (_, _, label) in METHODS.items():
        cells = []
        for key in SETTINGS:
            record = records.get(f"{key}-{name}")
            if record is None:
                cells.append("-")
                continue
            final = record.final
            cells.append(f"{100 * record.final_accuracy:.2f} / {100 * record.best_accuracy():.2f} "
                         f"(ARI {final.ari:.2f})")
            rows.append({"setting": key, "run": name, "clients": len(record.clients),
                         "accuracy": final.accuracy, "best": record.best_accuracy(),
                         "ari": final.ari, "restarts": final.restarts})
        if any(c != "-" for c in cells):
            table.append([label, *cells])
    lines += markdown_table(["method", *(label for label, _ in SETTINGS.values())], table)
    for key, (label, _) in SETTINGS.items():
        curves = {METHODS[n][2]: records[f"{key}-{n}"] for n in METHODS
                  if f"{key}-{n}" in records}
        if curves:
            plot_accuracy_curves(curves, session.out / f"accuracy-{key}.png",
                                 title=f"{label} (preset {config.preset})")
    session.finish("\n".join(lines) + "\n", rows)


if __name__ == "__main__":
    run_cli(main)
