"""One run of any registered method from any start, on the preset's clients.

``--method`` is a clustered federated method (the kit's or a plugin's, e.g.
``cp-cfl``), ``--pretraining`` the start it runs from (a self-supervised method,
``none``, or ``fedavg``: FedAvg's encoder); either defaults to the preset's, which
``--set federated.method=...`` changes. The run is the tables' run of the same config:
the same checks, record (``<method>-<pretraining>-seed<seed>.json``), resume and
``--dry-run``, taken from the committed tree where this machine would make it bit for
bit, and compared with the committed run of its config where one exists.

``--from RECORD.json`` re-makes a stored run from its record: its config as it was asked
for (preset, seed, every setting; ``--data-dir``/``--manual-dir`` may point at this
machine's data), always trained here, and then compared with the record: on the kind of
CPU that made it and from its starting encoder it is the record bit for bit, else the
comparison line says which of the two differs.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from cpcfl_tf.errors import ArgumentParser, UserError, run_cli
from cpcfl_tf.records.record import RunRecord
from cpcfl_tf.running.runner import RunSpec
from cpcfl_tf.running.script import Script

SCRIPT = Script(__file__, __doc__, compares_in_tree=True)


def options(parser: ArgumentParser) -> None:
    parser.add_argument("--method", help="the clustered federated method (default: the "
                        "preset's federated.method, or --set's)")
    parser.add_argument("--pretraining", help="the start: an SSL method, none, or fedavg "
                        "(default: the preset's federated.pretraining, or --set's)")
    parser.add_argument("--from", dest="from_record", metavar="RECORD.json",
                        help="re-make the run a run record stores, from its config (no "
                        "--preset, --seed, --set, --method or --pretraining with it)")


GIVEN_BY_RECORD = ("--preset", "--seed", "--set", "--method", "--pretraining")
"""The options whose values ``--from`` takes from the record."""


def stored_run(path: str, argv: Sequence[str]) -> RunRecord:
    """The run record ``--from`` names, refused in one line (before any folder is made)
    where it is no file, no run record, a centralized baseline's, or where an option the
    record gives was given too."""
    from cpcfl_tf.methods.federated import METHODS
    from cpcfl_tf.records.store import run_record_in

    both = [o for o in GIVEN_BY_RECORD if any(a == o or a.startswith(o + "=") for a in argv)]
    if both:
        raise UserError(f"--from takes the run's settings from its record; drop {', '.join(both)}")
    file = Path(path)
    if not file.is_file():
        raise UserError(f"--from {path} is not a file; give a run record (a run's .json)")
    record = run_record_in(file) if file.suffix == ".json" else None
    if record is None:
        raise UserError(f"--from {path} is not a run record (it has no config, rounds and "
                        "final result); give a run's .json, not a report or a summary")
    if not METHODS[record.method].federated:
        raise UserError(f"--from {path} is a centralized baseline's record ({record.method}); "
                        "re-make it with its script (experiments/datasets.py)")
    return record


def spec_of(config) -> RunSpec:
    """The one run asked for: the config's method and start."""
    fl = config.federated
    return RunSpec(f"{fl.method}-{fl.pretraining}-seed{config.seed}", fl.method,
                   fl.pretraining)


def report(name: str, record: RunRecord) -> str:
    """The run's short report: accuracy at the quarters, the final scores and cost."""
    fl, final = record.config.federated, record.final
    marks = fl.quarters
    lines = [f"# {name} (preset `{record.config.preset}`), {len(record.clients)} clients, "
             f"T = {fl.rounds}", "",
             "| " + " | ".join(f"T={t}" for t in marks) + " | ARI | restarts |",
             "|" + "---|" * (len(marks) + 2),
             "| " + " | ".join(f"{100 * record.accuracy_at(t):.2f}" for t in marks)
             + f" | {final.ari:.3f} | {final.restarts} |", "",
             f"Accuracy (%): mean of the clients' local test accuracies. Bytes over the run: "
             f"{final.bytes_down:,} down, {final.bytes_up:,} up."]
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    parser = SCRIPT.parser()
    options(parser)
    args = parser.parse_args(argv)
    stored = None
    if args.from_record is not None:
        import sys

        stored = stored_run(args.from_record, sys.argv[1:] if argv is None else argv)
        args.config, args.preset = stored.requested, stored.requested.preset
    # --method and --pretraining are the config's settings, checked with the rest before
    # any folder is made (an unknown name: one line naming the registered ones)
    args.set = [*args.set, *(f"federated.{key}={value}" for key, value in
                             (("method", args.method), ("pretraining", args.pretraining))
                             if value is not None)]
    session = SCRIPT.session(args)
    spec = spec_of(session.config)
    if stored is None:
        session.reuse_committed()  # --from re-makes the run: never taken from a tree
    record = session.run_all([spec])[spec.name]
    if stored is not None:
        from cpcfl_tf.running.compare import against_record

        print(f"against {args.from_record}: {against_record(record, stored)}", flush=True)
    session.finish(report(spec.name, record))


if __name__ == "__main__":
    run_cli(main)
