"""tab:different_number_of_clients and fig:num_clients: FedAvg, IFCA and CP-CFL with
15, 30, 60 and 90 clients (T = 40, 60, 100, 100, Sec. "Number of clients").

Every client keeps 50 images, so more clients means more data. The ``quick`` preset caps
T at its own 40 rounds (CPU time); ``smoke`` uses 3, 6 and 9 clients.
"""
from __future__ import annotations

from collections.abc import Sequence

from cpcfl_tf.errors import run_cli
from cpcfl_tf.evidence.catalogue import (
    COMPARISON_LABELS,
    client_settings,
    clients_partition,
    comparison_specs,
)
from cpcfl_tf.running.report import markdown_table
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, rows=tuple(COMPARISON_LABELS))

PAPER = {"fedavg-none": ((34.27, 36.13), (36.93, 37.07), (44.13, 50.73), (46.58, 46.78)),
         "fedavg-simclr": ((47.47, 47.47), (54.00, 54.20), (59.33, 59.83), (57.71, 59.04)),
         "ifca-none": ((57.60, 58.53), (62.67, 62.67), (67.80, 67.80), (70.80, 70.93)),
         "ifca-fedavg": ((56.67, 59.87), (62.60, 64.33), (70.90, 72.07), (68.95, 70.36)),
         "cp-cfl-simclr": ((70.67, 70.67), (73.87, 74.93), (76.80, 78.33), (79.80, 80.27))}
"""The paper's (final, best) accuracy (%) per run and setting, STL-10 on a GPU."""
LABELS = COMPARISON_LABELS


def main(argv: Sequence[str] | None = None) -> None:
    session = SCRIPT.start(argv)
    config, grid = session.config, client_settings(session.config)
    specs = {(n, spec.key): spec for n, t in grid
             for spec in comparison_specs(f"c{n}-", partition=clients_partition(config, n),
                                          federated={"rounds": t})}
    session.kept(list(specs.values()))
    records = {key: session.runner.run(spec) for key, spec in specs.items()
               if session.wanted(key[1])}
    labels = {name: label for name, label in LABELS.items() if session.wanted(name)}

    from cpcfl_tf.evidence.plots import plot_accuracy_curves

    lines = [f"# Number of clients (preset `{config.preset}`)", "",
             "Accuracy (%) at the last round and the best round; the paper's STL-10 figures "
             "(GPU) after the slash.", ""]
    table, rows = [], []
    for name, label in labels.items():
        cells = []
        for k, (n, t) in enumerate(grid):
            record = records[(n, name)]
            final, best = record.final_accuracy, record.best_accuracy()
            paper = PAPER[name][k] if k < len(PAPER[name]) and config.preset != "smoke" else None
            cells += [f"{100 * final:.2f}" + (f" / {paper[0]:.2f}" if paper else ""),
                      f"{100 * best:.2f}" + (f" / {paper[1]:.2f}" if paper else "")]
            rows.append({"clients": n, "rounds": t, "run": name, "accuracy": final, "best": best,
                         "ari": record.final.ari, "restarts": record.final.restarts})
        table.append([label, *cells])
    header = ["method"] + [cell for n, t in grid for cell in (f"{n} clients, T={t}", "best")]
    lines += markdown_table(header, table)
    for n, t in grid:
        plot_accuracy_curves({label: records[(n, name)] for name, label in labels.items()},
                             session.out / f"accuracy-c{n}.png",
                             title=f"{n} clients, T = {t} (preset {config.preset})")
    session.finish("\n".join(lines) + "\n", rows)


if __name__ == "__main__":
    run_cli(main)
