"""Beyond the paper: how often CP-CFL (SimCLR), IFCA (None), CP-CFL with IFCA's restart
rule and CP-CFL+features (the first choice after Tc from the frozen encoder's features: a
remedy that adds no round) end with the clients' true groups, over many runs, and why
CP-CFL merges groups.

Run r (0-based) draws its partition, initial weights and batch order with seed
``--seed + r``; its SimCLR encoder is pre-trained with seed ``--seed + r`` for the first
``--encoders`` runs and shared after that (run r uses run ``r mod --encoders``'s
encoder, ``pretrain.seed`` in its record), so the runs span that many distinct encoders.
They are made encoder by encoder (runs r, r + ``--encoders``, ...) and reported by run.
Runs 0-4 are then the trials' configs: in the kit's own tree a committed run this machine
would make bit for bit is taken from there. Every run made here records the selection
diagnostic for ``--diagnose`` rounds (the clients' pool losses and margins at their first
choices by loss: docs/experiments.md).

Per method: runs ending with the true groups (final ARI 1), k of n with the 95 %
Clopper-Pearson interval; accuracy of the runs that found them and of those that did not;
restarts; the round the clusters settled. Paired by run (same partition and encoder),
each pair of methods by the claims' rule, and claim C4's link over all these runs.
"""
from __future__ import annotations

from collections.abc import Sequence

from cpcfl_tf.errors import UserError, run_cli
from cpcfl_tf.evidence.reliability import ROWS, figures, study_rows
from cpcfl_tf.evidence.reliability_report import remedy_lines, report, verdict_line
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

DEFAULTS = {"smoke": (3, 2), "quick": (50, 25), "standard": (20, 5), "paper": (20, 5)}
"""Per preset: runs, distinct encoders (issue: quick at least 50 runs and 20 encoders;
standard at least 20 runs)."""
DIAGNOSE = 5
"""Rounds of the selection diagnostic each run made here records."""

SCRIPT = Script(__file__, __doc__, default_preset="quick", rows=tuple(ROWS))


def specs(seed: int, runs: int, encoders: int, rows: dict = ROWS) -> list[RunSpec]:
    """Run r of each method of ``rows`` (see the module's docstring)."""
    out = []
    for r in range(runs):
        shared = {} if r < encoders else {"seed": seed + r % encoders}
        for name, (method, pre) in rows.items():
            out.append(RunSpec(f"run{r}-{name}", method, pre, seed=seed + r, row=name,
                               pretrain=shared if pre != "none" else {}))
    return out


def by_encoder(planned: list[RunSpec], seed: int, encoders: int) -> list[RunSpec]:
    """``planned`` in the order they are made: encoder by encoder (runs r, r + encoders,
    ...), so an encoder's runs are done together and a study resumed with an empty cache
    (a later session, another machine of the same kind) pre-trains no encoder twice."""
    def order(spec: RunSpec) -> tuple[int, int]:
        run = spec.seed_or(seed)
        return (run - seed) % encoders, run

    return sorted(planned, key=order)


def _options(parser) -> None:
    parser.add_argument("--runs", type=int, help="runs per method (default: quick 50, "
                                                 "standard 20, smoke 3)")
    parser.add_argument("--encoders", type=int, help="distinct SimCLR encoders (default: "
                                                     "quick 25, standard 5, smoke 2)")
    parser.add_argument("--all-figures", action="store_true",
                        help="draw every diagnosed run's selection figure (default: the runs "
                             "that merged groups and the first that found them, per method)")
    parser.add_argument("--report", action="store_true",
                        help="make no run: write the report from the runs finished in the "
                             "output folder, headed partial, naming how many are missing")
    parser.set_defaults(diagnose=DIAGNOSE)


def counts(args) -> tuple[int, int]:
    """``(runs, encoders)`` of the command line, the preset's defaults for those not given;
    a one-line error for counts the study cannot use (before anything is written)."""
    runs_default, encoders_default = DEFAULTS[args.preset]
    runs = runs_default if args.runs is None else args.runs
    encoders = encoders_default if args.encoders is None else args.encoders
    if runs < 2 or not 1 <= encoders <= runs:
        raise UserError(f"--runs must be >= 2 and --encoders in [1, runs]; got --runs {runs} "
                        f"--encoders {encoders}")
    return runs, encoders


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    _options(parser)
    args = parser.parse_args(argv)
    runs, encoders = counts(args)
    session = SCRIPT.session(args)
    config = session.config
    session.reuse_committed()
    # The preset's rows, or exactly those --methods names (CP-CFL+features on any preset,
    # also when --methods names all four).
    rows = (study_rows(config.preset) if args.rows is parser.get_default("rows")
            else {name: ROWS[name] for name in args.rows})
    by_run: dict[str, dict[int, RunRecord]] = {name: {} for name in rows if session.wanted(name)}
    planned = specs(args.seed, runs, encoders, rows)
    done, missing_specs = session.run_or_read(by_encoder(planned, args.seed, encoders),
                                              args.report)
    rank = {spec.name: k for k, spec in enumerate(planned)}  # the report's order
    done.sort(key=lambda pair: rank[pair[0].name])
    missing_specs.sort(key=lambda spec: rank[spec.name])
    for spec, record in done:
        by_run[spec.key][spec.seed_or(args.seed) - args.seed] = record
    missing = [spec.name for spec in missing_specs]
    by_run = {name: records for name, records in by_run.items() if records}

    text, summary, csv_rows = report(config, by_run, runs, encoders, args.seed)
    if missing:
        held = sum(map(len, by_run.values()))
        title, rest = text.split("\n", 1)
        text = (f"{title}\n\n**Partial: {held} of {held + len(missing)} runs.** Every rate, "
                f"mean and verdict below is over the finished runs alone; the first missing: "
                f"`{missing[0]}`. `{session.resume_command()}` makes the rest.\n" + rest)
        summary["missing"] = missing
    figures(by_run, session.out, config.preset, args.all_figures)
    from cpcfl_tf.records.files import write_json
    write_json(session.out / f"{SCRIPT.name}.json", summary)
    session.finish(text, csv_rows)
    if set(by_run) == set(study_rows(config.preset)) and not missing:
        session.update_readme("reliability", summary["table"], "reliability tables")
        session.update_readme("reliability", [verdict_line(config, summary)],
                              "reliability line of the verdicts", front=True)
        if remedy_lines(summary):
            session.update_readme("remedy", remedy_lines(summary), "remedy for the merges")


if __name__ == "__main__":
    run_cli(main)
