"""Draw the selection diagnostic of run records made with ``--diagnose K`` (any script made
of runs): per record, each client's margin (second-lowest minus lowest pool loss) in the
diagnosed rounds by true group, and the clients per cluster in every round
(:func:`cpcfl_tf.evidence.plots.plot_selection`; how to read it: docs/experiments.md, "Reading the
selection diagnostic"). ``experiments/clustering_reliability.py`` draws its own runs'.

    python tools/plot_selection.py \
        results/quick/clustering_reliability/run5-cp-cfl-simclr.json --out figures

Writes ``<out>/<record's name>.png`` per record; every record is read and checked before
anything is drawn.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cpcfl_tf.errors import ArgumentParser, UserError, run_cli
from cpcfl_tf.methods.federated import run_label
from cpcfl_tf.records.record import RunRecord, read_record


def diagnosed(path: Path) -> RunRecord:
    """The run record at ``path``, if it holds the selection diagnostic; a one-line error
    naming the fix otherwise."""
    if not path.is_file():
        raise UserError(f"{path} is not a file: pass the .json of a run record")
    record = read_record(path)
    if not any(r.selection for r in record.rounds):
        raise UserError(f"{path} has no selection diagnostic: make the run with --diagnose K "
                        "(e.g. python experiments/table2.py --diagnose 5)")
    return record


def main(argv: Sequence[str] | None = None) -> list[Path]:
    from cpcfl_tf.evidence.plots import plot_selection
    from cpcfl_tf.records.files import prepare_out_dir

    parser = ArgumentParser(prog="python tools/plot_selection.py",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("records", nargs="+", type=Path, help="run records (.json)")
    parser.add_argument("--out", type=Path, default=Path("."), help="folder of the figures "
                                                                    "(default: here)")
    args = parser.parse_args(argv)
    records = {path: diagnosed(path) for path in args.records}
    out = prepare_out_dir(args.out, fix="pass --out DIR with a writable folder")
    drawn = []
    for path, record in records.items():
        drawn.append(plot_selection(
            record, out / f"{path.stem}.png",
            title=f"{run_label(record.method, record.pretraining)}, {path.stem}: final ARI "
                  f"{record.final.ari:.2f}"))
        print(f"wrote {drawn[-1]}")
    return drawn


if __name__ == "__main__":
    run_cli(main)
