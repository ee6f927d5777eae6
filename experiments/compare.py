"""A reproducer's runs against the committed ones.

For every run record under ``--results`` (e.g. the ``--out`` folder of your own run of a
table script, or a whole tree from another machine): the committed record of the same
config under ``--reference`` (default ``results/<preset>``) and whether yours matches it
bit for bit (every round and the final metrics), differs within the range of the
committed seeds of the same settings (the seed-to-seed spread), or lies outside it. Then
``python experiments/claims.py --results DIR`` says whether the paper's claims hold in
your runs.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cpcfl_tf.errors import ArgumentParser, UserError, run_cli
from cpcfl_tf.plan.presets import PRESETS
from cpcfl_tf.running.compare import compare_runs, comparison_lines


def main(argv: Sequence[str] | None = None) -> None:
    parser = ArgumentParser(prog="python experiments/compare.py",
                            description=__doc__.split("\n\n")[0])
    parser.add_argument("--results", required=True, help="your runs (a folder of run records)")
    parser.add_argument("--preset", default="quick", choices=list(PRESETS),
                        help="the committed reference is results/<preset> (default quick)")
    parser.add_argument("--reference", help="the reference tree (default results/<preset>)")
    args = parser.parse_args(argv)
    ours = Path(args.results)
    reference = Path(args.reference or Path("results") / args.preset)
    for folder, what in ((ours, "--results"), (reference, "--reference")):
        if not folder.is_dir():
            raise UserError(f"{what} {folder} is not a folder; pass a folder of run records")
    comparisons = compare_runs(ours, reference)
    if not comparisons:
        raise UserError(f"no run records under {ours}; pass the --out folder of a table script")
    print("\n".join(comparison_lines(comparisons)))


if __name__ == "__main__":
    run_cli(main)
